"""The CLIs as a user runs them: initialize_model.py and checkpoints.py, happy paths and every bad input."""

from __future__ import annotations

import json
import subprocess

import pytest

from codeparrot.repository.base import with_run_mark
from codeparrot.repository.refs import open_repository

from ..script_cases import run_cases


@pytest.fixture
def cli_env(scripts_env, tmp_path):
    """The scripts' environment (the same dict as `scripts_env`) with this test's own cache folder."""
    scripts_env["CODEPARROT_CACHE"] = str(tmp_path / "cache")
    return scripts_env


@pytest.fixture
def run(python, cli_env, repo_root):
    def run(script, *args):
        return subprocess.run([python, str(repo_root / "scripts" / script), *map(str, args)],
                              capture_output=True, text=True, env=cli_env, timeout=120)
    return run


@pytest.fixture
def run_all(python, cli_env, repo_root):
    """`run_all([(script, argv), ...])`: each as `python scripts/SCRIPT ARGV`, in order, in one process
    (tests/script_cases.py: the imports are paid once, not once per command line)."""
    return lambda cases: run_cases(python, cli_env, [(repo_root / "scripts" / script, argv) for script, argv in cases])


@pytest.fixture(scope="module")
def tokenizer_dir(stdlib_texts, tmp_path_factory):
    from codeparrot.tokenizer import save_tokenizer, train_tokenizer

    return save_tokenizer(train_tokenizer(stdlib_texts[:10], vocab_size=400, show_progress=False),
                          tmp_path_factory.mktemp("tok") / "tokenizer")


def _one_line_error(proc, *needles):
    assert proc.returncode != 0, (proc.args, proc.stdout)
    err = proc.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, (proc.args, err)
    for needle in needles:
        assert str(needle) in err, (proc.args, err)


@pytest.mark.slow
def test_initialize_tiny_model_into_local_repository(run_all, tokenizer_dir, tmp_path, repo_root):
    """initialize_model.py, then checkpoints.py list / log / download on what it made, then a second initialize:
    in this order, in one process (tests/script_cases.py)."""
    from transformers import AutoTokenizer, GPT2LMHeadModel

    repo, out = tmp_path / "models" / "tiny", tmp_path / "initial"
    initialize = ("initialize_model.py", ["--model-config", repo_root / "configs/model/tiny.yaml",
                                          "--tokenizer", tokenizer_dir, "--repo", repo])
    proc, listing, log, download, again = run_all([
        (initialize[0], [*initialize[1], "--n_layer", "2"]),
        ("checkpoints.py", ["list", repo]),
        ("checkpoints.py", ["log", repo, "--branch", "main", "--json"]),
        ("checkpoints.py", ["download", repo, "--revision", "main", "--output-dir", out]),
        initialize])
    assert proc.returncode == 0, proc.stderr
    assert "parameters" in proc.stdout and "vocab 400" in proc.stdout
    assert listing.returncode == 0 and listing.stdout.splitlines()[1].split()[:2] == ["main", "-"]
    assert [c["message"] for c in json.loads(log.stdout)] == ["initial model"]
    assert download.returncode == 0, download.stderr
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "model_config.yaml"} <= {p.name for p in out.iterdir()}
    model = GPT2LMHeadModel.from_pretrained(str(out))
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    assert model.config.vocab_size == len(tokenizer) == 400 and model.config.n_layer == 2
    assert model.config.eos_token_id == tokenizer.eos_token_id
    # A second initialization would silently stack another "initial model" on main: refused.
    _one_line_error(again, "already has an initial model")


def test_browse_and_promote_with_the_cli(run, tmp_path):
    repo = open_repository(str(tmp_path / "repo"), create=True)
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    repo.commit_folder(folder, "main", "initial model")
    ids = {}
    for branch in ("lr-3e-4", "lr-1e-3"):
        for step in (10, 20, 30):
            (folder / "weights.bin").write_text(f"{branch} {step}")
            ids[branch, step] = repo.commit_folder(folder, branch, f"step {step}")
    listing = run("checkpoints.py", "list", tmp_path / "repo")
    assert listing.returncode == 0, listing.stderr
    rows = [line.split() for line in listing.stdout.splitlines()[1:]]
    assert [r[0] for r in rows][0] == "main" and {r[0]: r[1] for r in rows} == {
        "main": "-", "lr-3e-4": "30", "lr-1e-3": "30"}
    log = run("checkpoints.py", "log", tmp_path / "repo", "--branch", "lr-1e-3")
    assert [line.split()[1] for line in log.stdout.splitlines()[1:]] == ["30", "20", "10", "-"]
    older = ids["lr-1e-3", 20]
    out = tmp_path / "out"
    assert run("checkpoints.py", "download", tmp_path / "repo", "--revision", older[:8], "--output-dir",
               out).returncode == 0
    assert (out / "weights.bin").read_text() == "lr-1e-3 20"
    promoted = run("checkpoints.py", "promote", tmp_path / "repo", "--revision", older)
    assert promoted.returncode == 0, promoted.stderr
    main_log = json.loads(run("checkpoints.py", "log", tmp_path / "repo", "--json").stdout)
    assert main_log[0]["step"] == 20 and older[:12] in main_log[0]["message"]
    (tmp_path / "main").mkdir()
    run("checkpoints.py", "download", tmp_path / "repo", "--revision", "main", "--output-dir", tmp_path / "main")
    assert (tmp_path / "main" / "weights.bin").read_text() == "lr-1e-3 20"


@pytest.mark.slow
def test_bad_inputs_are_one_line_errors_and_create_nothing(run_all, tokenizer_dir, tmp_path, repo_root):
    """Every bad input of initialize_model.py and checkpoints.py, each run as `python scripts/NAME.py ...` in one
    process (tests/script_cases.py: the imports are paid once, not once per case)."""
    tiny = repo_root / "configs/model/tiny.yaml"
    new_repo = tmp_path / "new-repo"
    (tmp_path / "empty").mkdir()
    bad = tmp_path / "bad.yaml"
    bad.write_text("n_layer: 2\nn_heads: 4\n")
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("mine")
    repo = open_repository(str(tmp_path / "repo"), create=True)
    repo.commit_folder(tmp_path / "plain", "main", "initial model")
    out = tmp_path / "out"
    init = ["--model-config"]
    pasted = "https://me:hf_abcdefghijklmnop@huggingface.co/u/m"
    cases = [  # (script, argv, what the one error line must name)
        # Tokenizer folder missing, or not a tokenizer.
        ("initialize_model.py", [*init, tiny, "--tokenizer", tmp_path / "nope", "--repo", new_repo], ["nope"]),
        ("initialize_model.py", [*init, tiny, "--tokenizer", tmp_path / "empty", "--repo", new_repo],
         ["not a tokenizer"]),
        # Model config: an unknown key, an impossible shape, a missing file.
        ("initialize_model.py", [*init, bad, "--tokenizer", tokenizer_dir, "--repo", new_repo], ["n_heads", "bad.yaml"]),
        ("initialize_model.py", [*init, tiny, "--tokenizer", tokenizer_dir, "--repo", new_repo, "--n_embd", "130"],
         ["n_embd (130) must be divisible by n_head (4)"]),
        ("initialize_model.py", [*init, tmp_path / "missing.yaml", "--tokenizer", tokenizer_dir, "--repo", new_repo],
         ["missing.yaml"]),
        # A repository path that is not a repository.
        ("initialize_model.py", [*init, tiny, "--tokenizer", tokenizer_dir, "--repo", tmp_path / "plain"],
         ["not a git repository"]),
        *[("checkpoints.py", [command[0], tmp_path / "plain", *command[1:]], ["not a git repository"])
          for command in (["list"], ["log", "--branch", "main"], ["promote", "--revision", "main"])],
        ("checkpoints.py", ["list", tmp_path / "missing"], ["missing"]),
        # A revision or branch that does not exist.
        ("checkpoints.py", ["download", tmp_path / "repo", "--revision", "step-999", "--output-dir", out],
         ["step-999"]),
        ("checkpoints.py", ["promote", tmp_path / "repo", "--revision", "v9"], ["v9"]),
        ("checkpoints.py", ["log", tmp_path / "repo", "--branch", "ghost"], ["ghost"]),
        # file:// names the same repository: it already has an initial model
        ("initialize_model.py", [*init, tiny, "--tokenizer", tokenizer_dir, "--repo", f"file://{tmp_path / 'repo'}"],
         ["already has an initial model"]),
        # A pasted URL (with a token in it) is no repository reference: refused, the token never printed.
        ("initialize_model.py", [*init, tiny, "--tokenizer", tokenizer_dir, "--repo", pasted],
         ["unsupported repository reference https://huggingface.co/"]),
        ("checkpoints.py", ["list", pasted], ["unsupported repository reference"]),
    ]
    results = run_all([(script, argv) for script, argv, _ in cases])
    for (script, argv, needles), proc in zip(cases, results):
        _one_line_error(proc, *needles)
        assert "hf_abcdefghijklmnop" not in proc.stderr + proc.stdout
    assert not new_repo.exists()
    assert [p.name for p in (tmp_path / "plain").iterdir()] == ["notes.txt"]
    assert not out.exists()
    assert [c.message for c in repo.list_commits("main")] == ["initial model"]


def test_hub_read_side_for_real_through_an_olah_mirror(run, scripts_env, python, tmp_path, olah_mirror):
    """list / download / from_pretrained(revision=...) against a real Hub API server (olah, offline mode)."""
    from codeparrot.repository.local import LocalGitRepository

    repo = LocalGitRepository(tmp_path / "mirrors" / "models" / "user" / "tiny", create=True, use_lfs=False)
    folder = tmp_path / "f"
    folder.mkdir()
    ids = {}
    for step in (0, 1, 2):
        (folder / "config.json").write_text(json.dumps({"step": step}))
        (folder / "model.safetensors").write_bytes(bytes([step]) * 1000)
        ids[step] = repo.commit_folder(folder, "main" if step == 0 else "run-a",
                                       "initial model" if step == 0 else f"step {step}")
    scripts_env.update(HF_ENDPOINT=olah_mirror(), HF_HUB_OFFLINE="0", HF_HOME=str(tmp_path / "hf-home"))
    listing = run("checkpoints.py", "list", "user/tiny")
    assert listing.returncode == 0, listing.stderr
    assert [line.split()[0] for line in listing.stdout.splitlines()[1:]] == ["main", "run-a"]
    out = tmp_path / "older"
    proc = run("checkpoints.py", "download", "user/tiny", "--revision", ids[1], "--output-dir", out)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "config.json").read_text()) == {"step": 1}
    assert (out / "model.safetensors").read_bytes() == bytes([1]) * 1000
    code = ("from codeparrot.repository import resolve_model_dir; import json; "
            "print(json.load(open(resolve_model_dir('user/tiny', 'run-a') / 'config.json'))['step'])")
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, env=scripts_env, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "2", proc.stderr
    missing = run("checkpoints.py", "download", "user/tiny", "--revision", "nope", "--output-dir", tmp_path / "x")
    _one_line_error(missing, "user/tiny")
    assert not (tmp_path / "x").exists()


def test_pushed_losses_drive_plot_and_promote_from_the_repository_alone(run, tmp_path):
    """The pusher writes each checkpoint's validation loss (from the run's metrics.jsonl) into the commit;
    `checkpoints.py plot` draws the curve and `promote BRANCH` picks the lowest loss with nothing but the
    repository (the run folder is deleted first), saying which, why, and what main held before."""
    import shutil

    from codeparrot.repository.pusher import CheckpointPusher

    repo_path = tmp_path / "repo"
    repo = open_repository(str(repo_path), create=True)
    init = tmp_path / "init"
    init.mkdir()
    (init / "config.json").write_text("{}")
    initial = repo.commit_folder(init, "main", "initial model")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    losses = {10: 6.5, 20: 5.25, 30: 5.5}  # the best is not the newest
    pusher = CheckpointPusher(str(repo_path), "exp", backoff_s=0.01)
    for step, loss in losses.items():
        with open(run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"step": step, "loss": loss + 1, "tokens_seen": step * 64}) + "\n")
            f.write(json.dumps({"step": step, "tokens_seen": step * 64, "val_loss": loss, "perplexity": 1.0,
                                "val_tokens": 630, "val_sequences": 10, "val_seq_length": 64}) + "\n")
        ckpt = run_dir / "checkpoints" / f"step-{step}"  # training's layout: <run>/checkpoints/step-N
        ckpt.mkdir(parents=True)
        (ckpt / "weights.bin").write_text(f"step {step}")
        pusher.push(ckpt, f"step {step}")
    assert pusher.wait() == []
    commits = {c.step: c.commit_id for c in repo.list_commits("exp") if c.step}
    shutil.rmtree(run_dir)

    png = tmp_path / "plot.png"
    plotted = run("checkpoints.py", "plot", repo_path, "--branch", "exp", "--output", png)
    assert plotted.returncode == 0, plotted.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    points = json.loads(png.with_suffix(".json").read_text())
    assert [(p["step"], p["loss"]) for p in points] == list(losses.items())
    assert all(p["measured_on"] == "10 sequences x 64 tokens (630 predicted tokens)" for p in points)
    assert "validation loss 5.2500" in plotted.stdout and "on 10 sequences x 64 tokens" in plotted.stdout

    promoted = run("checkpoints.py", "promote", repo_path, "--revision", "exp")
    assert promoted.returncode == 0, promoted.stderr
    out = promoted.stdout
    assert f"step 20 ({commits[20][:12]})" in out and "lowest pushed validation loss" in out and "5.2500" in out
    assert "the newest, step 30, has 5.5000" in out
    assert f"main before: {initial[:12]} 'initial model'" in out
    main_log = repo.list_commits("main")
    assert main_log[0].step == 20 and commits[20][:12] in main_log[0].message
    # a branch without pushed losses: promoted at its newest checkpoint, and the report says there was no loss
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "weights.bin").write_text("x")
    repo.commit_folder(folder, "bare", with_run_mark("step 5", "bare"))  # marked, as the pusher does
    promoted = run("checkpoints.py", "promote", repo_path, "--revision", "bare")
    assert promoted.returncode == 0 and "no validation loss was pushed" in promoted.stdout
    assert f"main before: {main_log[0].commit_id[:12]}" in promoted.stdout
    # no pushed losses and no --dataset: a one-line error
    _one_line_error(run("checkpoints.py", "plot", repo_path, "--branch", "bare", "--output", png), "give --dataset")
