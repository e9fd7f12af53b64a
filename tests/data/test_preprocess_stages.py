"""`preprocess.py --recipe stack-v2` on a BigQuery-format export: planted secrets are gone from the shards and
nowhere in the printed output, stats.json or duplicate_clusters.json, their look-alikes stay; only allowed
licenses are written (a permissive copy of a file wins over an earlier GPL copy); encoded blobs are dropped; each
near-duplicate cluster keeps its most-copied file (ties: the first); every decision is counted; and the Ray
engine writes the same bytes. The default recipe is CodeParrot's: none of these stages run."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from codeparrot.data.encoded_data import encoded_data_reason
from codeparrot.data.filters import TextFilter
from codeparrot.data.preprocess import PreprocessConfig, preprocess
from codeparrot.tools.secret_sample import SECRET_KINDS, labelled_sample, stdlib_files

REPO_ROOT = Path(__file__).resolve().parents[2]
TIMING = {"seconds", "files_per_second", "mb_per_second", "config", "index_bytes_per_file", "inputs"}


def _passes_codeparrot_filters(text: str) -> bool:
    return TextFilter(seed=0).reasons([text]) == [None] and encoded_data_reason(text) is None


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(export path, what was planted): one record per line in the export's columns."""
    planted = [(t, p) for t, p in labelled_sample(60, seed=7) if _passes_codeparrot_filters(t)]
    secret_files = {}
    for text, plants in planted:  # one file per secret kind
        secret_files.setdefault(plants[0].kind, (text, plants))
    assert set(secret_files) == set(SECRET_KINDS)
    clean = [t for t in (p.read_text("utf-8") for p in stdlib_files(80, seed=11)) if len(t) > 3000
             and _passes_codeparrot_filters(t)]
    variants = lambda text: [text + f"\nvariant_{i} = {i}\n" for i in range(4)]  # noqa: E731
    base = next(t for t in clean if all(map(_passes_codeparrot_filters, variants(t))))  # no seeded random drop
    clean.remove(base)
    twin, other = clean[0], clean[1]
    records = []

    def add(path, content, license="mit", copies=1):
        records.append({"repo_name": f"org/{path.split('/')[0]}", "path": path, "copies": copies,
                        "size": len(content), "content": content, "license": license})

    for kind, (text, _) in secret_files.items():
        add(f"secrets/{kind}.py", text)
    # Licenses: the GPL copy comes first, its MIT twin later: the MIT one is written (license before exact dedup).
    add("gpl/first.py", twin, license="gpl-3.0")
    add("mit/second.py", twin, license="MIT")
    add("nolicense/a.py", clean[2], license=None)
    add("weird/a.py", clean[3], license="Some Custom License")
    add("mpl/a.py", clean[4], license="mpl-2.0")
    # Encoded data, wrapped as real files wrap it (a single long line would already fail max_line_length): a
    # base64 payload and a hex table, each one run over 1,024 characters.
    b64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB" * 40
    add("blob/b64.py", other + '\nICON = """\n' + "\n".join(b64[i:i + 76] for i in range(0, len(b64), 76)) + '"""\n')
    hex_rows = [", ".join(f"0x{(i + j) % 256:02x}" for j in range(12)) for i in range(0, 400, 12)]
    add("blob/hex.py", other + "\nTABLE = [\n    " + ",\n    ".join(hex_rows) + "]\n")
    # A near-duplicate cluster: copies 2, 9, 9, 1 -> cluster/1.py (the first of the two 9s) stays.
    for i, (text, copies) in enumerate(zip(variants(base), [2, 9, 9, 1])):
        add(f"cluster/{i}.py", text, copies=copies)
    raw = tmp_path_factory.mktemp("stages") / "export.jsonl"
    raw.write_text("".join(json.dumps(r) + "\n" for r in records))
    secrets = [p.value for _, plants in secret_files.values() for p in plants if p.is_secret]
    lookalikes = [p.value for _, plants in secret_files.values() for p in plants if not p.is_secret]
    return raw, secrets, lookalikes


def _written(out: Path) -> list[dict]:
    return [json.loads(line) for shard in sorted(out.rglob("*.json.gz")) for line in gzip.open(shard)]


def _everything_written(out: Path) -> str:
    return "".join(gzip.open(p).read().decode() if p.suffix == ".gz" else p.read_text()
                   for p in sorted(out.rglob("*")) if p.is_file())


def _decisions(out: Path) -> dict:
    stats = json.loads((out / "stats.json").read_text())
    return {"stats": {k: v for k, v in stats.items() if k not in TIMING},
            "clusters": (out / "duplicate_clusters.json").read_bytes(),
            "shards": {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
                       for p in sorted(out.rglob("*.gz"))}}


@pytest.fixture(scope="module")
def local_run(corpus, tmp_path_factory):
    """scripts/preprocess.py --recipe stack-v2 in a subprocess: (output folder, everything it printed)."""
    raw, _, _ = corpus
    out = tmp_path_factory.mktemp("local") / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "scripts/preprocess.py"), "--input", str(raw),
                           "--output-dir", str(out), "--recipe", "stack-v2", "--num-workers", "2",
                           "--valid-fraction", "0.2", "--samples-per-file", "8", "--no-progress"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out, proc.stdout + proc.stderr


def test_secrets_are_gone_from_shards_stats_clusters_and_logs_and_lookalikes_stay(corpus, local_run):
    _, secrets, lookalikes = corpus
    out, printed = local_run
    everything = _everything_written(out) + printed
    assert [s for s in secrets if s in everything] == []
    written = "".join(r["content"] for r in _written(out))
    assert all(v in written for v in lookalikes)
    contents = {r["path"]: r["content"] for r in _written(out)}
    assert all(f"secrets/{kind}.py" in contents for kind in SECRET_KINDS)  # redacted and kept, not dropped
    stats = json.loads((out / "stats.json").read_text())
    assert stats["files_redacted"] == len(SECRET_KINDS)
    assert set(stats["redacted_by_kind"]) >= {"email", "ip_address", "password_assignment", "private_key"}
    assert "secrets redacted" in printed


def test_licenses_encoded_data_and_most_copies(local_run):
    out, _ = local_run
    stats = json.loads((out / "stats.json").read_text())
    paths = {r["path"] for r in _written(out)}
    assert "mit/second.py" in paths and "gpl/first.py" not in paths  # the permissive copy wins exact dedup
    assert "nolicense/a.py" in paths and not {"weird/a.py", "mpl/a.py"} & paths
    assert stats["licenses"]["dropped_by_license"] == {"gpl-3.0": 1, "mpl-2.0": 1, "some custom license": 1}
    assert stats["licenses"]["dropped_by_reason"] == {"license_not_allowed": 2, "license_unrecognized": 1}
    assert stats["license_dropped"] == 3 and stats["exact_duplicates"] == 0
    assert stats["encoded_data_by_rule"] == {"base64": 1, "hex": 1} and not {"blob/b64.py", "blob/hex.py"} & paths
    assert {p for p in paths if p.startswith("cluster/")} == {"cluster/1.py"}
    clusters = json.loads((out / "duplicate_clusters.json").read_text())
    assert clusters["keep"] == "most-copies" and clusters["shingle_size"] == 5 and clusters["jaccard_threshold"] == 0.7
    assert clusters["clusters_keeping_a_later_file"] == 1
    assert stats["config"]["recipe"] == "stack-v2" and stats["config"]["redact_secrets"]


def test_the_default_recipe_runs_none_of_the_stages(corpus, tmp_path):
    raw, secrets, _ = corpus
    stats = preprocess(PreprocessConfig([str(raw)], str(tmp_path / "out"), num_workers=0, near_dedup=True,
                                        progress=False))
    written = "".join(r["content"] for r in _written(tmp_path / "out"))
    assert all(s in written for s in secrets)  # CodeParrot kept them: the switch is what removes them
    paths = {r["path"] for r in _written(tmp_path / "out")}
    assert "gpl/first.py" in paths and "blob/b64.py" in paths and "cluster/0.py" in paths
    assert stats["license_dropped"] == stats["encoded_data"] == stats["files_redacted"] == 0


def test_the_ray_engine_writes_the_same_bytes_with_every_stage_on(corpus, local_run, tmp_path, ray_session):
    raw, _, _ = corpus
    out, _ = local_run
    preprocess(PreprocessConfig([str(raw)], str(tmp_path / "ray"), recipe="stack-v2", engine="ray", num_workers=2,
                                valid_fraction=0.2, samples_per_file=8, progress=False, ray_block_records=3))
    assert _decisions(tmp_path / "ray") == _decisions(out)
