-- CodeParrot's raw corpus: every Python file of the GitHub snapshot on BigQuery, with its repository's license.
-- Produces the columns scripts/preprocess.py reads: repo_name, path, copies, size, content, license
-- (only `content` is required; the others pass through to the clean shards).
--
-- Run it in the BigQuery console (or `bq query --use_legacy_sql=false`) into a table of your own, then export
-- that table as newline-delimited JSON, gzip-compressed, to Cloud Storage (see docs/data.md,
-- "The real corpus"). The original export was about 180 GB / 20M files (about 70% of them duplicates).
--
-- The filters, as in the original: Python files (.py), not binary, 1 KiB <= size < 1 MiB.
-- One row per (repository, path, content); `copies` is how many times GitHub holds this exact content.
SELECT
  f.repo_name,
  f.path,
  c.copies,
  c.size,
  c.content,
  l.license
FROM
  `bigquery-public-data.github_repos.files` AS f
JOIN
  `bigquery-public-data.github_repos.contents` AS c
ON
  f.id = c.id
JOIN
  `bigquery-public-data.github_repos.licenses` AS l
ON
  f.repo_name = l.repo_name
WHERE
  NOT c.binary
  AND f.path LIKE '%.py'
  AND c.size >= 1024
  AND c.size < 1048576
