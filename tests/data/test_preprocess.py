"""The whole pipeline, through the CLI where exit codes and messages matter and through `preprocess()` otherwise:
a full run that `datasets` loads back, worker-count and seed determinism, exact and near dedup, every bad input,
and that a failed or killed run leaves no output folder."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import signal
import subprocess
import sysconfig
import time
from pathlib import Path

import pytest

from codeparrot.data.export import export_local
from codeparrot.data.filters import FilterConfig, TextFilter
from codeparrot.data.preprocess import PreprocessConfig, preprocess
from codeparrot.errors import CodeParrotError

STATS_KEYS = {"input_records", "bad_records", "exact_duplicates", "near_duplicates", "filtered", "kept_train",
              "kept_valid", "bytes_in", "bytes_out", "seconds", "files_per_second"}
ALL_FILTERS_OFF = FilterConfig(**{f.name: False for f in dataclasses.fields(FilterConfig) if f.type in (bool, "bool")})


def _rows(folder: Path) -> list[dict]:
    return [json.loads(line) for shard in sorted(folder.glob("*.json.gz")) for line in gzip.open(shard)]


def _write_jsonl(path: Path, records: list) -> Path:
    path.write_bytes(b"".join((json.dumps(r).encode() if isinstance(r, dict) else r) + b"\n" for r in records))
    return path


def _run(repo_root: Path, python: str, env: dict, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([python, str(repo_root / "scripts/preprocess.py"), "--no-progress", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A few dozen real stdlib files in the export format, plus 3 whitespace variants (exact duplicates) and 2
    lightly edited copies (near duplicates) in a second file."""
    root = tmp_path_factory.mktemp("corpus")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    export_local([stdlib / "json", stdlib / "email", stdlib / "urllib"], root / "raw", progress=False)
    rows = _rows(root / "raw")
    extra = []
    for row in rows[:3]:
        extra.append({**row, "path": "copy/" + row["path"], "content": row["content"].replace("\n", "\r\n  \n")})
    forks = 0
    for row in rows[3:]:  # two files that pass the filters (random drops included), edited a little
        fork = row["content"] + "\n# patched by a fork\n"
        if forks < 2 and TextFilter(seed=0).reasons([row["content"], fork]) == [None, None]:
            extra.append({**row, "path": "fork/" + row["path"], "content": fork})
            forks += 1
    (root / "raw" / "zz").mkdir()
    _write_jsonl(root / "raw" / "zz" / "extra.jsonl", extra)  # read after the export: files sort by path
    return root / "raw"


def test_full_run_prints_stats_and_loads_back_with_datasets(corpus, tmp_path, repo_root, python, scripts_env):
    out = tmp_path / "clean"
    result = _run(repo_root, python, scripts_env, "--input", str(corpus), "--output-dir", str(out), "--near-dedup",
                  "--num-workers", "2", "--valid-fraction", "0.2")
    assert result.returncode == 0, result.stderr
    assert "exact duplicates" in result.stdout and "kept: train" in result.stdout and "files/s" in result.stdout
    stats = json.loads((out / "stats.json").read_text())
    assert STATS_KEYS <= stats.keys() and {"filters", "decontaminate", "minhash"} <= stats["files_per_second"].keys()
    assert stats["exact_duplicates"] == 3
    assert stats["near_duplicates"] >= 2
    removed = (sum(stats["bad_records"].values()) + stats["exact_duplicates"] + sum(stats["filtered"].values())
               + stats["decontaminated"] + stats["near_duplicates"])
    assert removed + stats["kept_train"] + stats["kept_valid"] == stats["input_records"]
    assert stats["kept_valid"] > 0 and 0 < stats["bytes_out"] < stats["bytes_in"]
    # No --tokenizer: the characters-per-token filter did not run, and both the summary and stats.json say so.
    assert stats["filters_off"] == {"chars_per_token": "no --tokenizer"} and "chars_per_token" not in stats["filtered"]
    assert "filtered: chars_per_token (OFF: no --tokenizer)" in result.stdout
    assert stats["warnings"] == [] and "warning" not in result.stderr

    clusters = json.loads((out / "duplicate_clusters.json").read_text())
    assert clusters["num_clusters"] == len(clusters["clusters"]) >= 2
    for cluster in clusters["clusters"]:
        assert [m["kept"] for m in cluster] == [True] + [False] * (len(cluster) - 1)
    forked = [m for c in clusters["clusters"] for m in c if m["path"].startswith("fork/")]
    assert len(forked) == 2 and not any(m["kept"] for m in forked)  # the originals come first and are kept

    from datasets import load_dataset

    data = load_dataset("json", data_files={"train": str(out / "train/*.json.gz"), "valid": str(out / "valid/*.json.gz")},
                        cache_dir=str(tmp_path / "hf-cache"))
    assert data["train"].num_rows == stats["kept_train"] and data["valid"].num_rows == stats["kept_valid"]
    assert data["train"].column_names == ["repo_name", "path", "copies", "size", "content", "license"]
    assert not any(p.startswith(("copy/", "fork/")) for p in list(data["train"]["path"]) + list(data["valid"]["path"]))


def test_same_output_for_one_and_two_workers(corpus, tmp_path):
    outputs = []
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        preprocess(PreprocessConfig([str(corpus)], str(out), num_workers=workers, near_dedup=True, chunk_files=4,
                                    valid_fraction=0.2, progress=False))
        outputs.append({p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != "stats.json"})
    assert outputs[0] == outputs[1]
    assert len(outputs[0]) == 3  # train shard, valid shard, duplicate_clusters.json


def test_exact_dedup_keeps_the_first_occurrence_whatever_the_worker_count(tmp_path):
    base = "def area(w, h):\n    return w * h\n"
    records = [{"id": i, "content": text} for i, text in enumerate(
        ["print('other')\n", base, base.replace("    ", "\t"), "def area(w,h):\r\n    return w*h\r\n", base, "x=1\n"])]
    src = _write_jsonl(tmp_path / "in.jsonl", records)
    for workers in (0, 2):
        out = tmp_path / f"out{workers}"
        stats = preprocess(PreprocessConfig([str(src)], str(out), num_workers=workers, chunk_files=1, valid_fraction=0,
                                            decontaminate=False, filters=ALL_FILTERS_OFF, progress=False))
        assert [r["id"] for r in _rows(out / "train")] == [0, 1, 5]
        assert stats["exact_duplicates"] == 3


def test_codeparrot_near_dedup_case_keeps_two_of_three(tmp_path, repo_root, python, scripts_env):
    # "a "*20 and "a "*30 have the same token set {a} (>= 10 tokens): one cluster, the first kept. "b "*7 has 7
    # tokens (< --min-tokens 10): never clustered. Every filter would drop such files (few assignments, no
    # keywords, ...) and they differ after whitespace removal, so the filters are switched off to isolate the step.
    src = _write_jsonl(tmp_path / "in.jsonl", [{"content": "a " * 20}, {"content": "a " * 30}, {"content": "b " * 7}])
    off = [f"--no-{f.name.replace('_', '-')}" for f in dataclasses.fields(FilterConfig) if f.type in (bool, "bool")]
    out = tmp_path / "clean"
    result = _run(repo_root, python, scripts_env, "--input", str(src), "--output-dir", str(out), "--near-dedup",
                  "--no-decontaminate", "--valid-fraction", "0", "--num-workers", "2", *off)
    assert result.returncode == 0, result.stderr
    assert [r["content"] for r in _rows(out / "train")] == ["a " * 20, "b " * 7]
    stats = json.loads((out / "stats.json").read_text())
    assert stats["near_duplicates"] == 1 and stats["near_duplicate_clusters"] == 1
    assert [m["kept"] for m in json.loads((out / "duplicate_clusters.json").read_text())["clusters"][0]] == [True, False]


def test_same_seed_same_output_other_seed_other_random_drops(tmp_path):
    module = "import os\n\n" + "\n".join(f"def f{i}(x):\n    y = x + {i}\n    return y\n" for i in range(6))
    src = _write_jsonl(tmp_path / "in.jsonl", [{"content": f"# Unit tests, batch {i}\n" + module} for i in range(60)])

    def kept(seed: int, name: str) -> list[str]:
        preprocess(PreprocessConfig([str(src)], str(tmp_path / name), num_workers=0, seed=seed, valid_fraction=0,
                                    decontaminate=False, progress=False))
        return [r["content"] for r in _rows(tmp_path / name / "train")]

    first = kept(7, "a")
    assert kept(7, "b") == first
    assert kept(8, "c") != first
    assert 5 < len(first) < 35  # config-or-test files are dropped with p = 0.7


def _bad_corpus(folder: Path) -> list[str]:
    good = {"repo_name": "r", "path": "ok.py", "content": "def ok():\n    return 1\n"}
    _write_jsonl(folder / "a.jsonl", [good, b'{"content": "unterminated', {"path": "no_content.py"},
                                      {"content": None}, b'{"content": "caf\xe9"}', b'{"content": "nul\x00"}'])
    (folder / "empty.jsonl").write_bytes(b"")
    packed = gzip.compress(b"".join(json.dumps({**good, "path": f"g{i}.py"}).encode() + b"\n" for i in range(500)))
    (folder / "cut.jsonl.gz").write_bytes(packed[: len(packed) // 2])
    return ["malformed JSON", "missing text column", "non-string text", "invalid UTF-8", "NUL bytes", "empty file",
            "truncated gzip"]


def test_bad_records_are_counted_reported_and_the_run_goes_on(tmp_path, repo_root, python, scripts_env):
    (tmp_path / "in").mkdir()
    reasons = _bad_corpus(tmp_path / "in")
    out = tmp_path / "clean"
    result = _run(repo_root, python, scripts_env, "--input", str(tmp_path / "in"), "--output-dir", str(out),
                  "--num-workers", "1")
    assert result.returncode == 0, result.stderr
    stats = json.loads((out / "stats.json").read_text())
    assert set(stats["bad_records"]) == set(reasons) and all(c == 1 for c in stats["bad_records"].values())
    assert stats["exact_duplicates"] > 0  # the records before the gzip damage were read
    assert f"first 'malformed JSON' at {tmp_path / 'in' / 'a.jsonl'}:2" in result.stdout


def test_strict_fails_on_the_first_bad_record_and_leaves_no_output(tmp_path, repo_root, python, scripts_env):
    (tmp_path / "in").mkdir()
    _bad_corpus(tmp_path / "in")
    result = _run(repo_root, python, scripts_env, "--input", str(tmp_path / "in"), "--output-dir",
                  str(tmp_path / "clean"), "--strict", "--num-workers", "2")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"error: {tmp_path / 'in' / 'a.jsonl'}:2 (Unterminated string "
                                                  "starting at: column 13): malformed JSON (--strict stops at the "
                                                  "first bad record)"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]  # neither the output nor its temporary folder


def test_file_names_that_are_not_utf8_reach_the_clusters_file_and_the_printed_summary(tmp_path, load_script,
                                                                                      monkeypatch):
    """An input or output named with non-UTF-8 bytes (a str with lone surrogates in Python) is written to
    duplicate_clusters.json and printed in the summary with \\udcXX escapes, on a strict UTF-8 stdout (any UTF-8
    locale but C), instead of a traceback after the output was published."""
    import io

    folder = tmp_path / "in"
    folder.mkdir()
    text = "a " * 20
    try:
        src = _write_jsonl(folder / os.fsdecode(b"caf\xe9.jsonl"), [{"content": text}, {"content": text * 2}, b"[1]"])
    except (OSError, UnicodeEncodeError):
        pytest.skip("this file system does not take non-UTF-8 file names")
    out = tmp_path / os.fsdecode(b"clean\xe9")
    stdout = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    monkeypatch.setattr("sys.stdout", stdout)
    off = [f"--no-{f.name.replace('_', '-')}" for f in dataclasses.fields(FilterConfig) if f.type in (bool, "bool")]
    assert load_script("preprocess").main(["--input", str(folder), "--output-dir", str(out), "--near-dedup",
                                           "--num-workers", "0", "--no-decontaminate", "--valid-fraction", "0",
                                           "--no-progress", *off]) == 0
    members = json.loads((out / "duplicate_clusters.json").read_text(encoding="utf-8"))["clusters"][0]
    assert [m["input"] for m in members] == [f"{src}:1", f"{src}:2"]
    stdout.flush()
    printed = stdout.buffer.getvalue().decode("utf-8")
    assert "caf\\udce9.jsonl:3" in printed and "wrote " + str(tmp_path) + "/clean\\udce9/train (1 files)" in printed


@pytest.mark.parametrize("case", ["missing input", "no records", "unwritable output", "foreign output dir"])
def test_input_and_output_errors_are_one_line(case, tmp_path, repo_root, python, scripts_env):
    src = _write_jsonl(tmp_path / "in.jsonl", [{"content": "x = 1\n"}])
    out = tmp_path / "clean"
    if case == "missing input":
        src, expected = tmp_path / "nope.jsonl", "input not found"
    elif case == "no records":
        src.write_bytes(b'{"text": "wrong column"}\n\n'), None
        expected = "no valid records in 1 input file(s): missing text column: 1"
    elif case == "unwritable output":
        out, expected = src / "clean", f"{src} is a file, not a directory"  # no folder can be made inside a file
    else:
        out.mkdir()
        (out / "notes.md").write_text("mine")
        expected = "refusing to replace"
    result = _run(repo_root, python, scripts_env, "--input", str(src), "--output-dir", str(out), "--num-workers", "0")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert not list(tmp_path.glob(".clean.tmp-*"))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_run_leaves_no_output_folder(sig, tmp_path, repo_root, python, scripts_env):
    body = "\n".join(f"def handler_{j}(request, value_{j}):\n    result = value_{j} * {j}\n    return result" for j in range(40))
    _write_jsonl(tmp_path / "in.jsonl", [{"content": f"# module {i}\n" + body.replace("handler", f"h{i}")}
                                         for i in range(12000)])
    out = tmp_path / "clean"
    proc = subprocess.Popen([python, str(repo_root / "scripts/preprocess.py"), "--no-progress", "--input",
                             str(tmp_path / "in.jsonl"), "--output-dir", str(out), "--near-dedup", "--num-workers", "1"],
                            env=scripts_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".clean.tmp-*")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # well inside the first pass
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(sig)
    proc.wait(timeout=30)
    assert not out.exists()
    if sig == signal.SIGTERM:  # a catchable signal also removes the temporary folder, and says what stopped it
        assert not list(tmp_path.glob(".clean.tmp-*"))
        stderr = proc.stderr.read().decode()
        assert proc.returncode == 143 and stderr.strip().splitlines()[-1] == "stopped by SIGTERM", stderr
        assert "Traceback" not in stderr, stderr


def test_help_explains_every_flag_and_the_fixes(repo_root, python, scripts_env):
    result = subprocess.run([python, str(repo_root / "scripts/preprocess.py"), "--help"], env=scripts_env,
                            capture_output=True, text=True)
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    flags = ["--input", "--output-dir", "--near-dedup", "--num-workers", "--seed", "--text-column", "--strict",
             "--valid-fraction", "--samples-per-file", "--tokenizer", "--decontaminate", "--no-decontaminate",
             "--num-perm", "--jaccard-threshold", "--min-tokens"]
    flags += ["--" + f.name.replace("_", "-") for f in dataclasses.fields(FilterConfig)]
    assert [f for f in flags if f not in text] == []
    assert text.count("FIXED") >= 3  # assignments, config-or-test, keywords
    assert "`==`" in text and "20 lines" in text


def test_config_errors_are_clear(tmp_path):
    with pytest.raises(CodeParrotError, match="--valid-fraction"):
        preprocess(PreprocessConfig(["x"], str(tmp_path / "o"), valid_fraction=2.0))


@pytest.fixture(scope="module")
def small_tokenizer(tmp_path_factory, stdlib_texts) -> Path:
    """A 500-token byte-level BPE saved with save_pretrained (what --tokenizer takes)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(stdlib_texts[:30], trainers.BpeTrainer(vocab_size=500, show_progress=False,
                                                                   initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    folder = tmp_path_factory.mktemp("tok")
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(folder)
    return folder


CJK = "\n".join(f"变量{i} = '中文字符测试文本{i}'" for i in range(80)) + "\nfor k in []:\n    pass\n"


def test_tokenizer_enables_the_chars_per_token_filter_in_the_workers(tmp_path, stdlib_texts, small_tokenizer):
    (tmp_path / "tok").symlink_to(small_tokenizer)
    cjk = CJK
    code = next(t for t in stdlib_texts[30:] if TextFilter(seed=0).reason(t) is None)  # passes the other filters
    src = _write_jsonl(tmp_path / "in.jsonl", [{"content": code}, {"content": cjk}])
    stats = preprocess(PreprocessConfig([str(src)], str(tmp_path / "out"), num_workers=1, tokenizer=str(tmp_path / "tok"),
                                        valid_fraction=0, decontaminate=False, progress=False))
    assert stats["filtered"]["chars_per_token"] == 1 and stats["filters_off"] == {}
    assert [r["content"] for r in _rows(tmp_path / "out" / "train")] == [code]
    # stages that did not run (no near dedup, no decontamination) get no time and no rate of files over ~0 s
    assert "filters" in stats["seconds"] and not {"minhash", "decontaminate"} & stats["files_per_second"].keys()
    with pytest.raises(CodeParrotError, match="tokenizer not found"):
        preprocess(PreprocessConfig([str(src)], str(tmp_path / "out2"), tokenizer=str(tmp_path / "missing")))


def test_an_empty_valid_split_is_a_warning_at_preprocessing_time(tmp_path, repo_root, python, scripts_env):
    # 3 files x 1% ~ 0.03 expected valid files: the split ends up empty, which training would only report later.
    code = "def area_{i}(width, height):\n    size = width * height\n    return size\n"
    src = _write_jsonl(tmp_path / "in.jsonl", [{"content": code.format(i=i)} for i in range(3)])
    result = _run(repo_root, python, scripts_env, "--input", str(src), "--output-dir", str(tmp_path / "out"),
                  "--num-workers", "0", "--no-filter-few-assignments")
    assert result.returncode == 0, result.stderr
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats["kept_valid"] == 0 and stats["kept_train"] == 3
    assert stats["filters_off"] == {"chars_per_token": "no --tokenizer", "few_assignments": "--no-filter-few-assignments"}
    assert len(stats["warnings"]) == 1 and "valid split is empty" in stats["warnings"][0]
    assert "warning: the valid split is empty" in result.stderr and "--valid-fraction 0.01" in result.stderr
    assert (tmp_path / "out" / "valid").is_dir()  # still an (empty) folder
    # --valid-fraction 0 asks for no valid split: nothing to warn about.
    stats = preprocess(PreprocessConfig([str(src)], str(tmp_path / "out0"), num_workers=0, valid_fraction=0,
                                        progress=False))
    assert stats["kept_valid"] == 0 and stats["warnings"] == []


def test_a_second_pass_with_a_tokenizer_equals_one_pass_with_it(tmp_path, stdlib_texts, small_tokenizer):
    # What the demo does (its tokenizer is trained after preprocessing): preprocess, then run the clean splits
    # through preprocess again with --tokenizer. Every other decision depends only on the content and seed, so
    # the result is the single run with the tokenizer: same files, same splits.
    src = _write_jsonl(tmp_path / "in.jsonl", [{"content": t} for t in [CJK, *stdlib_texts[30:90], CJK + "# 2\n"]])
    common = dict(num_workers=0, valid_fraction=0.2, progress=False, seed=3)
    once = preprocess(PreprocessConfig([str(src)], str(tmp_path / "once"), tokenizer=str(small_tokenizer), **common))
    first = preprocess(PreprocessConfig([str(src)], str(tmp_path / "first"), **common))
    second = preprocess(PreprocessConfig([str(tmp_path / "first" / "train"), str(tmp_path / "first" / "valid")],
                                         str(tmp_path / "second"), tokenizer=str(small_tokenizer), **common))
    dropped = once["filtered"]["chars_per_token"]
    assert dropped >= 2 and second["filtered"]["chars_per_token"] == dropped  # the two CJK files at least
    assert sum(second["filtered"].values()) == dropped and second["kept_valid"] > 0
    for split in ("train", "valid"):
        assert (sorted(r["content"] for r in _rows(tmp_path / "second" / split))
                == sorted(r["content"] for r in _rows(tmp_path / "once" / split)))
    assert first["kept_train"] + first["kept_valid"] == once["kept_train"] + once["kept_valid"] + dropped


def test_relative_paths_are_resolved_before_the_work(corpus, tmp_path, monkeypatch):
    """Relative --input and --output-dir name the same files from another working directory of the workers:
    the engine gets absolute paths, and the stats name the inputs absolutely."""
    monkeypatch.chdir(corpus.parent)
    stats = preprocess(PreprocessConfig([corpus.name], "rel-out", num_workers=1, progress=False))
    assert all(Path(p).is_absolute() for p in stats["inputs"]) and stats["config"]["output_dir"] == str(
        corpus.parent / "rel-out")
    assert len(_rows(corpus.parent / "rel-out" / "train")) == stats["kept_train"] > 0


@pytest.mark.parametrize("damage", ["delete", "truncate", "extra"])
def test_an_output_whose_shards_do_not_match_the_writers_report_is_never_published(damage, corpus, tmp_path,
                                                                                   monkeypatch):
    """The shards are checked on disk (present, the size written, the kept rows, nothing else) before the rename:
    a shard lost after it was written (a node's private disk, a crashed copy) fails the run in one line and
    leaves no output folder."""
    import codeparrot.data.local_engine as local_engine

    real_run = local_engine.run

    def run_then_damage(job):
        result = real_run(job)
        shard = job.tmp / "train" / result.shards["train"][0].name
        if damage == "delete":
            shard.unlink()
        elif damage == "truncate":
            shard.write_bytes(shard.read_bytes()[:-10])
        else:
            (job.tmp / "train" / "file-000000000099.json.gz").write_bytes(shard.read_bytes())
        return result

    monkeypatch.setattr(local_engine, "run", run_then_damage)
    with pytest.raises(CodeParrotError, match="output check failed: train/") as err:
        preprocess(PreprocessConfig([str(corpus)], str(tmp_path / "out"), num_workers=0, samples_per_file=10,
                                    progress=False))
    assert "\n" not in str(err.value)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))
