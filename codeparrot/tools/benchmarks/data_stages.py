"""The optional data stages of `preprocess.py` (issue 22), per file on one core: the license decision, the
encoded-data filter, secret redaction (ours and detect-secrets', for comparison) and 5-gram MinHash; plus the
precision and recall of both secret detectors on the labelled sample of `codeparrot.tools.secret_sample`.

Costs are CPU seconds of this process (`time.process_time`) over the site-packages files (the stdlib subset
with --quick), so other jobs sharing the machine inflate them less than wall-clock. detect-secrets runs on a
subset (it is about 20x slower): its per-file figure is over those files.
"""

from __future__ import annotations

import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Callable

from codeparrot.data.encoded_data import encoded_data_reason
from codeparrot.data.licenses import LicenseFilter
from codeparrot.data.near_dedup import MinHasher
from codeparrot.data.secret_redaction import EMAIL, redact, _emails
from codeparrot.tools.benchmarks.common import BenchRow, area_cli, print_rows
from codeparrot.tools.secret_sample import Plant, labelled_sample, stdlib_files

QUICK_FILES, FULL_SAMPLE, DETECT_SECRETS_FILES = 300, 400, 300
TARGET_MS_PER_FILE = 1.0  # secret redaction on site-packages (issue 22)


def detect_secrets_redact(text: str) -> str:
    """detect-secrets' route: every default plugin on every line (its public `scan_file`), each reported value
    replaced by <KEY> wherever it occurs, plus our email rule (detect-secrets has no email plugin; StarCoder2 also
    paired it with an email regex)."""
    from detect_secrets.core.scan import scan_file
    from detect_secrets.settings import default_settings

    with tempfile.NamedTemporaryFile("w", suffix=".py", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        with default_settings():
            values = {s.secret_value for s in scan_file(f.name) if s.secret_value}
    for value in sorted(values, key=len, reverse=True):
        text = text.replace(value, "<KEY>")
    for start, end, _, _ in reversed(_emails(text)):
        text = text[:start] + EMAIL + text[end:]
    return text


def score(redactor: Callable[[str], str], sample: list[tuple[str, list[Plant]]]) -> dict:
    """Planted secrets gone (true positives) or left (misses), look-alikes gone (false positives) or left."""
    tp = fn = fp = tn = 0
    missed: set[str] = set()
    wrongly: set[str] = set()
    for text, plants in sample:
        out = redactor(text)
        for p in plants:
            gone = p.value not in out
            if p.is_secret:
                tp, fn = tp + gone, fn + (not gone)
                if not gone:
                    missed.add(p.kind)
            else:
                fp, tn = fp + gone, tn + (not gone)
                if gone:
                    wrongly.add(p.kind)
    return {"precision": tp / max(tp + fp, 1), "recall": tp / max(tp + fn, 1), "tp": tp, "fn": fn, "fp": fp,
            "missed": sorted(missed), "false_positive_kinds": sorted(wrongly)}


def _cpu_ms_per_file(fn: Callable[[str], object], texts: list[str]) -> float:
    start = time.process_time()
    for text in texts:
        fn(text)
    return (time.process_time() - start) * 1000 / max(len(texts), 1)


def _corpus(quick: bool) -> tuple[str, list[str]]:
    if quick:
        return "stdlib subset", [p.read_text("utf-8", "replace") for p in stdlib_files(QUICK_FILES, seed=1)]
    root = Path(sysconfig.get_paths()["purelib"])
    texts = [p.read_text("utf-8", "replace") for p in sorted(root.rglob("*.py")) if p.is_file()]
    return "site-packages", [t for t in texts if 0 < len(t) < 1_048_576]  # the export's size bound


def rows(quick: bool = False) -> list[BenchRow]:
    name, texts = _corpus(quick)
    mb = sum(map(len, texts)) / 1e6
    licenses = LicenseFilter("permissive")
    hasher = MinHasher(256, 0, 10, shingle_size=5)
    stages: list[tuple[str, Callable[[str], object], list[str]]] = [
        ("license decision", lambda t: licenses.reason("GPL-3.0"), texts),
        ("encoded-data filter", encoded_data_reason, texts),
        ("secret redaction", redact, texts),
        ("MinHash 5-gram shingles", lambda t: hasher.signatures([t]), texts),
        ("MinHash token set (CodeParrot's)", lambda t, h=MinHasher(256, 0, 10): h.signatures([t]), texts),
    ]
    try:
        import detect_secrets  # noqa: F401

        stages.append(("detect-secrets (all plugins) + email rule", detect_secrets_redact,
                       texts[:: max(len(texts) // DETECT_SECRETS_FILES, 1)]))
    except ImportError:
        pass
    out = []
    for label, fn, files in stages:
        ms = _cpu_ms_per_file(fn, files)
        note = f"{len(files):,} files, {sum(map(len, files)) / 1e6:.0f} MB of {mb:.0f} MB; CPU ms/file, one core"
        if label == "secret redaction" and not quick:
            note += f"; target <= {TARGET_MS_PER_FILE} ms/file"
        out.append(BenchRow(f"data stages: {label} ({name})", "ms/file", ms, ms, ms, 1, note))
    sample = labelled_sample(FULL_SAMPLE if not quick else 100, seed=0)
    detectors = {"ours": lambda t: redact(t)[0]}
    if any(label.startswith("detect-secrets") for label, _, _ in stages):
        detectors["detect-secrets"] = detect_secrets_redact
    for who, redactor in detectors.items():
        s = score(redactor, sample)
        note = (f"{len(sample)} stdlib files, {s['tp'] + s['fn']} planted secrets, {len(sample)} look-alikes; "
                f"precision {s['precision']:.3f}; missed kinds {s['missed'] or 'none'}; look-alikes removed "
                f"{s['false_positive_kinds'] or 'none'}")
        out.append(BenchRow(f"data stages: secret recall, {who} (labelled sample)", "recall", s["recall"],
                            s["recall"], s["recall"], 1, note))
    return out


if __name__ == "__main__":
    area_cli(__doc__, lambda flags: print_rows(rows(quick=flags.quick)))
