"""Stage 1, data: a raw BigQuery GitHub export in, clean train/valid shards out.

Takes in: newline-delimited JSON (optionally gzipped) with `content, repo_name, path, size, license, copies`
(`export.py` writes the same format from any local source tree). Gives out: `OUTPUT/train/` and
`OUTPUT/valid/` gzip JSONL shards (`shards.py`), `stats.json` and `duplicate_clusters.json`.

`preprocess.py` runs the steps in order: exact dedup (`exact_dedup.py`), CodeParrot's heuristic filters
(`filters.py`), HumanEval decontamination (`decontaminate.py`), MinHash near dedup (`near_dedup.py` signatures,
`lsh.py` clustering), the split. `records.py` is how every stage reads records: which files a path names, one
line iterator, one parser, the bad-line policy.
"""
