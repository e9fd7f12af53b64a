"""The typed config system: YAML < CLI precedence, type checks, unknown keys, nested dotted overrides."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

import pytest

from codeparrot.config import REQUIRED, describe, doc, from_dict, load_config, load_yaml, parse_overrides, to_dict
from codeparrot.config_flags import config_parser, parse_config
from codeparrot.errors import CodeParrotError


@dataclass
class Optim:
    lr: float = doc(5e-4, "peak learning rate")
    betas: list = doc([0.9, 0.999], "AdamW betas")


@dataclass
class Cfg:
    name: str = doc("run", "run name")
    steps: int = doc(10, "number of optimizer steps")
    bf16: bool = doc(False, "use bf16")
    schedule: Literal["cosine", "linear"] = doc("cosine", "lr schedule")
    resume: Optional[str] = doc(None, "checkpoint to resume from")
    optim: Optim = doc(Optim, "optimizer settings")


@dataclass
class Limits:
    limit: Optional[float] = doc(None, "a limit; null = none")
    rates: list[float] = doc([], "some rates")


def test_defaults_then_yaml_then_cli(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("steps: 20\noptim:\n  lr: 1.0e-3\n")
    cfg = load_config(Cfg, path, ["--optim.lr", "2e-4", "--bf16", "--name=x"])
    assert cfg.steps == 20  # from the file
    assert cfg.optim.lr == pytest.approx(2e-4)  # CLI beats the file
    assert cfg.bf16 is True and cfg.name == "x"
    assert cfg.optim.betas == [0.9, 0.999]  # default
    assert to_dict(cfg)["optim"]["lr"] == pytest.approx(2e-4)


def test_mutable_defaults_are_not_shared():
    a, b = Cfg(), Cfg()
    a.optim.betas.append(1.0)
    assert b.optim.betas == [0.9, 0.999]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["--stepz", "3"], "unknown config key stepz (did you mean steps?)"),
        (["--steps", "three"], "steps: expected an integer"),
        (["--optim.lr", "fast"], "optim.lr: expected a number"),
        (["--schedule", "step"], "schedule: expected one of"),
        (["--optim.momentum", "0.9"], "unknown config key optim.momentum"),
    ],
)
def test_bad_values_are_one_line_errors(overrides, message):
    with pytest.raises(CodeParrotError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        load_config(Cfg, None, overrides)


def test_yaml_errors_name_the_file_and_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("steps: 3\noptim: [unclosed\n")
    with pytest.raises(CodeParrotError, match=r"bad.yaml:\d+: invalid YAML"):
        load_config(Cfg, path)
    path.write_text("steps: 3\nwarmup: 2\n")
    with pytest.raises(CodeParrotError, match=r"bad.yaml: unknown config key warmup"):
        load_config(Cfg, path)
    with pytest.raises(CodeParrotError, match="config file not found"):
        load_config(Cfg, tmp_path / "missing.yaml")


def test_a_key_given_twice_is_refused_at_any_depth_naming_both_lines(tmp_path):
    path = tmp_path / "twice.yaml"
    for text, line, key, first in [("steps: 2\nname: a\nsteps: 8\n", 3, "steps", 1),
                                   ("optim:\n  lr: 1.0e-3\n  betas: [0.9, 0.95]\n  lr: 2.0e-3\n", 4, "lr", 2),
                                   ("optim:\n  lr: 1.0e-3\nsteps: 2\noptim:\n  betas: [0.9, 0.95]\n", 4, "optim", 1)]:
        path.write_text(text)
        with pytest.raises(CodeParrotError) as err:
            load_config(Cfg, path)
        assert str(err.value) == f"{path}:{line}: invalid YAML: duplicate key {key!r} (first on line {first})"


def test_the_yaml_merge_key_still_overrides_what_it_merges(tmp_path):
    path = tmp_path / "merge.yaml"
    path.write_text("base: &base\n  steps: 3\n  name: a\nrun:\n  <<: *base\n  steps: 5\n")
    assert load_yaml(path)["run"] == {"steps": 5, "name": "a"}


def test_unreadable_non_utf8_and_folder_config_files_are_one_line_errors(tmp_path, monkeypatch):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("steps: 3\nname: caf\u00e9\n".encode("latin-1"))
    with pytest.raises(CodeParrotError, match=rf"^{path}:2: not UTF-8 text \(byte offset 18\)"):
        load_config(Cfg, path)
    with pytest.raises(CodeParrotError, match=rf"^{tmp_path} is a folder, not a config file"):
        load_config(Cfg, tmp_path)
    path.write_text("steps: 3\n")

    def refuse(self):  # what a file without read permission does (the tests may run as root, who reads anything)
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(type(path), "read_bytes", refuse)
    with pytest.raises(CodeParrotError, match=rf"^{path}: cannot read the config file: Permission denied$"):
        load_config(Cfg, path)


@pytest.mark.parametrize("text, message", [
    ("", "the config file is empty"),
    ("# every key commented out\n# steps: 3\n\n", "the config file is empty"),
    ("- steps\n- 3\n", "expected a mapping of config keys at the top level, got list"),
    ("steps\n", "expected a mapping of config keys at the top level, got str 'steps'"),
])
def test_an_empty_file_or_a_top_level_that_is_no_mapping_is_refused(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(CodeParrotError, match=f"^{path}: {message}"):
        load_config(Cfg, path)
    path.write_text("{}\n")  # an explicit empty mapping says "all defaults" on purpose
    assert load_config(Cfg, path) == Cfg()


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "1e999"])
def test_non_finite_floats_are_refused_from_the_command_line(value):
    with pytest.raises(CodeParrotError, match=r"^command line: optim\.lr: expected a finite number, got "):
        load_config(Cfg, None, ["--optim.lr", value])


def test_non_finite_floats_are_refused_from_yaml_lists_optionals_and_flags(tmp_path):
    path = tmp_path / "c.yaml"
    for spelling, shown in ((".inf", "inf"), ("-.inf", "-inf"), (".nan", "nan")):
        path.write_text(f"optim:\n  lr: {spelling}\n")
        with pytest.raises(CodeParrotError, match=rf"^{path}: optim\.lr: expected a finite number, got {shown}$"):
            load_config(Cfg, path)
    path.write_text("rates: [0.5, .nan]\n")
    with pytest.raises(CodeParrotError, match=rf"^{path}: rates\[1\]: expected a finite number, got nan$"):
        load_config(Limits, path)
    with pytest.raises(CodeParrotError, match=r"^limit: expected a finite number, got 10{400}$"):
        from_dict(Limits, {"limit": 10**400})  # an integer beyond float's range
    with pytest.raises(CodeParrotError, match=r"^limit: expected a finite number, got nan$"):
        from_dict(Limits, {"limit": "nan"})  # Optional[float]: the float's own message, not "float | None"
    with pytest.raises(CodeParrotError, match=r"^--limit: expected a finite number, got inf$"):
        parse_config(Limits, ["--limit", "inf"])  # flags generated from the dataclass
    assert from_dict(Limits, {"limit": None}).limit is None and from_dict(Limits, {"limit": "2"}).limit == 2.0


def test_null_clears_optional_and_describe_lists_every_field():
    assert parse_overrides(["--resume", "null"]) == {"resume": None}
    assert load_config(Cfg, None, {"resume": "auto"}).resume == "auto"
    text = describe(Cfg)
    for key in ("--name", "--steps", "--bf16", "--schedule", "--resume", "--optim.lr", "--optim.betas"):
        assert key in text
    assert "peak learning rate" in text


def test_atomic_outputs_have_normal_permissions_and_leave_nothing_on_failure(tmp_path):
    import os
    import stat

    from codeparrot.atomic_io import atomic_dir, atomic_write_json

    atomic_write_json(tmp_path / "a.json", {"x": 1})
    mask = os.umask(0o022)
    os.umask(mask)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o666 & ~mask
    with atomic_dir(tmp_path / "out") as tmp:
        (tmp / "f").write_text("1")
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o777 & ~mask
    with pytest.raises(RuntimeError):
        with atomic_dir(tmp_path / "broken") as tmp:
            (tmp / "half").write_text("1")
            raise RuntimeError("crash mid-write")
    assert not (tmp_path / "broken").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "out"]  # no temp leftovers


def test_atomic_dir_removes_what_killed_runs_left_and_nothing_else(tmp_path):
    """A run killed by SIGKILL (the out-of-memory killer, a stall watchdog's exit) leaves its temporary folder; the
    next run for the same output removes those of dead processes of this machine, never a running one's or another
    machine's (a shared filesystem)."""
    import os
    import subprocess
    import sys

    from codeparrot.atomic_io import _owner, atomic_dir

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    host = _owner().split("-", 1)[0]
    stale = tmp_path / f".out.tmp-{host}-{dead_pid}-abc123"
    live = tmp_path / f".out.tmp-{host}-{os.getpid()}-def456"
    elsewhere = tmp_path / f".out.tmp-otherhost-{dead_pid}-ghi789"
    other_output = tmp_path / f".other.tmp-{host}-{dead_pid}-jkl000"
    for folder in (stale, live, elsewhere, other_output):
        (folder / "train").mkdir(parents=True)
        (folder / ".spool.jsonl").write_text("spooled records")
    with atomic_dir(tmp_path / "out") as tmp:
        (tmp / "stats.json").write_text("{}")
    assert not stale.exists() and live.is_dir() and elsewhere.is_dir() and other_output.is_dir()
    assert (tmp_path / "out" / "stats.json").is_file()


def test_atomic_dir_flushes_everything_it_publishes_to_disk(tmp_path, monkeypatch):
    """Every file and folder of the published tree, and the parent holding the renames, is fsynced: after a power
    loss the output is either the old one or the whole new one, never a complete-looking folder of empty files."""
    import os

    from codeparrot import atomic_io

    synced = set()
    real_fsync = os.fsync

    def fsync(fd):
        synced.add(os.fstat(fd).st_ino)
        real_fsync(fd)

    monkeypatch.setattr(atomic_io.os, "fsync", fsync)
    with atomic_io.atomic_dir(tmp_path / "out") as tmp:
        (tmp / "train").mkdir()
        for name in ("train/a.json.gz", "train/b.json.gz", "stats.json"):
            (tmp / name).write_bytes(b"data")
    published = [tmp_path / "out", *(tmp_path / "out").rglob("*")]
    assert {p.stat().st_ino for p in published} | {tmp_path.stat().st_ino} <= synced


def test_replacing_an_output_never_leaves_a_moment_without_it(tmp_path, monkeypatch):
    """A crash at any point of publishing leaves the old output or the new one, never none: after every rename
    `out` is a complete folder. Where the exchange is not offered (NFS, macOS) two renames do it."""
    import os

    from codeparrot import atomic_io

    out = tmp_path / "out"
    with atomic_io.atomic_dir(out) as tmp:
        (tmp / "stats.json").write_text("old")
    monkeypatch.setattr(atomic_io, "_renameat2", lambda a, b, flags: False)  # the fallback: correct, not crash-proof
    with atomic_io.atomic_dir(out) as tmp:
        (tmp / "stats.json").write_text("fallback")
    assert (out / "stats.json").read_text() == "fallback" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    monkeypatch.undo()
    probe = [tmp_path / "a", tmp_path / "b"]
    for folder in probe:
        folder.mkdir()
    offered = atomic_io._renameat2(*probe, atomic_io._RENAME_EXCHANGE)
    for folder in probe:
        folder.rmdir()
    if not offered:
        pytest.skip(f"{tmp_path}'s filesystem offers no atomic exchange (the fallback above passed)")
    real_rename = os.rename

    def rename(src, dst):
        real_rename(src, dst)
        assert (out / "stats.json").is_file(), f"rename {src} -> {dst} left no {out}"

    monkeypatch.setattr(atomic_io.os, "rename", rename)
    for version in ("new", "newer"):
        with atomic_io.atomic_dir(out) as tmp:
            (tmp / "stats.json").write_text(version)
        assert (out / "stats.json").read_text() == version
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # the old folder removed, wherever it went


def test_a_run_killed_while_replacing_by_two_renames_loses_no_output(tmp_path, monkeypatch):
    """Without the exchange, a run killed between the two renames leaves no `out`, the last one published at
    `.out.old-HOST-PID`: the next run puts it back. Killed after them, it leaves that old folder beside the new
    `out`: the next run removes it, never a running process's or another machine's."""
    import os
    import subprocess
    import sys

    from codeparrot import atomic_io

    class Killed(BaseException):
        pass

    def killed_after(src, dst):
        real_rename(src, dst)
        raise Killed  # right after `out` was moved aside

    out, real_rename = tmp_path / "out", os.rename
    with atomic_io.atomic_dir(out) as tmp:
        (tmp / "v").write_text("published")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host, dead = atomic_io._owner().split("-", 1)[0], int(gone.stdout)
    with monkeypatch.context() as patch, pytest.raises(Killed):
        patch.setattr(atomic_io, "_owner", lambda: f"{host}-{dead}")  # the killed run: gone when the next one starts
        patch.setattr(atomic_io, "_renameat2", lambda a, b, flags: False)
        patch.setattr(atomic_io.os, "rename", killed_after)
        with atomic_io.atomic_dir(out) as tmp:
            (tmp / "v").write_text("unpublished")
    assert not out.exists() and (tmp_path / f".out.old-{host}-{dead}" / "v").read_text() == "published"
    atomic_io.remove_stale_temporaries(out)
    assert (out / "v").read_text() == "published" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    left = [tmp_path / f".out.old-{owner}" for owner in (f"{host}-{dead}", f"{host}-{os.getpid()}", f"other-{dead}")]
    for folder in left:
        folder.mkdir()
    with atomic_io.atomic_dir(out) as tmp:
        (tmp / "v").write_text("new")
    assert (out / "v").read_text() == "new" and [folder.exists() for folder in left] == [False, True, True]


@pytest.mark.parametrize("renameat2", ["offered", "not offered"])
def test_an_output_made_only_if_nobody_made_it_first(tmp_path, monkeypatch, renameat2):
    """`replace=False` (a new repository): when another process published `out` meanwhile, theirs stays, this
    block's folder is removed and the caller gets FileExistsError."""
    from codeparrot import atomic_io

    if renameat2 == "not offered":
        monkeypatch.setattr(atomic_io, "_renameat2", lambda a, b, flags: False)
    out = tmp_path / "out"
    with atomic_io.atomic_dir(out, replace=False) as tmp:
        (tmp / "who").write_text("first")
    with pytest.raises(FileExistsError):
        with atomic_io.atomic_dir(out, replace=False) as tmp:
            (tmp / "who").write_text("second")
    assert (out / "who").read_text() == "first" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@dataclass
class _Nested:
    level: int = doc(6, "gzip level")
    strip: bool = doc(True, "keep whitespace", flag="--no-strip", inverted=True)


@dataclass
class _CliConfig:
    inputs: list[str] = doc(REQUIRED, "input files", flag="--input", extend=True)
    model: str | None = doc(None, "a model", exclusive="source", required=True)
    canonical: bool = doc(False, "the canonical answers", exclusive="source")
    rank_by: Literal["mean", "max"] = doc("mean", "line ranking")
    decontaminate: bool = doc(True, "drop contaminated files")
    temperatures: list[float] = doc([0.2], "temperatures", flag="--temperature")
    nested: _Nested = doc(_Nested, "nested flags", group="nested")
    internal: int = doc(64, "not a flag", cli=False)

    def validate(self) -> None:
        if self.nested.level > 9:
            raise CodeParrotError(f"--level must be 0-9, got {self.nested.level}")


def test_flags_generated_from_a_dataclass_round_trip():
    """Flag names, switches, lists, choices and exclusive groups come from the fields; parsing builds the
    validated dataclass back (inverted switches, nested fields, untouched non-flag fields)."""
    cfg = parse_config(_CliConfig, ["--input", "a", "b", "--input", "c", "--canonical", "--no-decontaminate",
                                    "--temperature", "0.2", "0.8", "--level", "9", "--no-strip", "--rank-by", "max"])
    assert cfg == _CliConfig(inputs=["a", "b", "c"], canonical=True, rank_by="max", decontaminate=False,
                             temperatures=[0.2, 0.8], nested=_Nested(level=9, strip=False))
    assert parse_config(_CliConfig, ["--input", "a", "--model", "m"]).nested == _Nested()
    parser = config_parser(_CliConfig)
    actions = {a.dest: a for a in parser._actions}
    assert actions["input"].required and actions["rank_by"].choices == ["mean", "max"]
    assert actions["no_strip"].default is False and "internal" not in actions
    assert "nested" in [g.title for g in parser._action_groups]
    for bad in (["--input", "a"], ["--input", "a", "--model", "m", "--canonical"], ["--model", "m"],
                ["--input", "a", "--model", "m", "--rank-by", "median"]):
        with pytest.raises(SystemExit):  # argparse's usage error: missing/conflicting/invalid flags
            parse_config(_CliConfig, bad)
    with pytest.raises(CodeParrotError, match="--level must be 0-9, got 10"):
        parse_config(_CliConfig, ["--input", "a", "--model", "m", "--level", "10"])
