"""Shared fixtures. Every test runs offline: no Hub, W&B offline, tokenizers and torch single-threaded."""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
# One thread per process (here, before torch is imported, and in every process the tests start): `make test` runs
# one pytest worker per core and the training runs they launch add more; torch's default, a thread per core in
# each, oversubscribes the cores, and waiting OpenMP threads spin (a tiny training step measured 1,100 ms of CPU
# at 2 threads on the busy 2-core machine, 70 ms at 1). Tests about thread counts set their own.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The CPU's matmul peak (the MFU denominator) is given, not measured, in the training runs the tests start: a
# measurement on a busy machine is not cached, so every run would spend ~2 s of large matmuls on it. The
# measurement itself is tested where it matters (test_mfu.py, test_resume.py's uninterrupted run, test_bench.py).
os.environ.setdefault("CODEPARROT_PEAK_TFLOPS", "1")

REPO_ROOT = Path(__file__).resolve().parent.parent
# What the "memorized" tiny model learned (`tiny_models`): greedy decoding from the first signature gives the
# first body followed by "\ndef sub", so stop rules and loss maps have something real to work on.
MEMORIZED_CODE = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n"


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """Materialized revisions and measured CPU peaks go to a per-session folder, not ~/.cache."""
    os.environ["CODEPARROT_CACHE"] = str(tmp_path_factory.mktemp("codeparrot-cache"))


def slow_seconds(item) -> float:
    """What a test is expected to cost: `slow(SECONDS)`, 10 for a plain `slow`, 0 for the others."""
    mark = item.get_closest_marker("slow")
    return 0.0 if mark is None else float(mark.args[0]) if mark.args else 10.0


def pytest_collection_modifyitems(config, items):
    """Order for `make test`'s parallel workers, then GPU skips.

    `make test` runs pytest-xdist with `--dist loadscope --no-loadscope-reorder`: each test module goes to one
    worker whole (its module fixtures, e.g. a training run several tests inspect, are built once), and modules
    are handed out in the order of their first test here. Tests marked `slow` come first, the most expensive
    first (`slow(SECONDS)`: the CPU seconds they cost on the 2-core machine; plain `slow`: 10), so the long
    modules start at once and the short ones fill the gaps at the end; otherwise the collection order stays (the
    same on every worker, as xdist requires). Tests marked `gpu` are skipped on machines without CUDA."""
    items.sort(key=lambda item: -slow_seconds(item))  # stable: the collection order among equals
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except Exception:  # pragma: no cover - torch missing is a broken install, reported elsewhere
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def stdlib_texts() -> list[str]:
    """About 200 real Python files from the running interpreter's standard library (1 KiB ≤ size < 64 KiB),
    in a deterministic order: realistic code for tokenizer, filter and dataset tests."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for path in sorted(stdlib.glob("*.py")):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if 1024 <= len(data) < 65536:
            try:
                texts.append(data.decode("utf-8"))
            except UnicodeDecodeError:
                continue
        if len(texts) >= 200:
            break
    assert len(texts) >= 100, f"too few stdlib files found under {stdlib}"
    return texts


@pytest.fixture
def scripts_env() -> dict[str, str]:
    """Environment for running `scripts/*.py` in a subprocess with this interpreter, offline."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.fixture(scope="session")
def launch_port():
    """`launch_port() -> int`: a TCP port free on 127.0.0.1 right now (for `--main_process_port`: the default 29500
    would collide with another launch of a parallel test worker, or with the user's own)."""
    import socket

    def pick() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    return pick


@pytest.fixture(scope="session")
def python() -> str:
    return sys.executable


@pytest.fixture(scope="session")
def load_script():
    """`load_script("generate")`: `scripts/generate.py` imported as a module (scripts are not a package), to call
    its `main(argv)` in-process."""
    import importlib.util

    def load(name: str):
        spec = importlib.util.spec_from_file_location(f"script_{name}", REPO_ROOT / "scripts" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load


def olah_cli() -> str | None:
    """olah (a Hub mirror serving local git repositories) pins old dependencies (psutil 5), so it lives in its
    own environment: point CODEPARROT_OLAH at its `olah-cli`, or have `olah-cli` on PATH."""
    import shutil

    return os.environ.get("CODEPARROT_OLAH") or shutil.which("olah-cli")


@pytest.fixture
def olah_mirror(tmp_path):
    """`start() -> url`: a real Hub API server (olah, offline mode) on 127.0.0.1 serving the git repositories
    under `tmp_path/mirrors` (`models/OWNER/NAME`, `datasets/OWNER/NAME`; plain git: olah reads LFS objects
    only from a worktree's .git/lfs). Call it once the repositories exist. Skipped when olah is not installed."""
    import socket
    import subprocess
    import time
    import urllib.error
    import urllib.request

    cli = olah_cli()
    if cli is None:
        pytest.skip("olah not installed (set CODEPARROT_OLAH=/path/to/olah-cli)")
    servers = []

    def start() -> str:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        (tmp_path / "olah.toml").write_text(
            f'[basic]\nhost = "127.0.0.1"\nport = {port}\nmirror-netloc = "127.0.0.1:{port}"\n'
            f'mirror-lfs-netloc = "127.0.0.1:{port}"\nrepos-path = "{tmp_path / "olah-cache"}"\n'
            f'mirrors-path = ["{tmp_path / "mirrors"}"]\n\n[accessibility]\noffline = true\n')
        servers.append(subprocess.Popen([cli, "-c", str(tmp_path / "olah.toml")], cwd=tmp_path,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        url, deadline = f"http://127.0.0.1:{port}", time.time() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/models/none/none/refs", timeout=2).read()
                return url
            except urllib.error.HTTPError:  # an answer, even a 404, means the server is up
                return url
            except OSError:
                assert time.time() < deadline and servers[-1].poll() is None, "olah did not start"
                time.sleep(0.3)

    yield start
    for server in servers:
        server.terminate()
        server.wait(10)


@pytest.fixture(scope="session")
def memorized_code() -> str:
    """The text the "memorized" model of `tiny_models` was overfit on."""
    return MEMORIZED_CODE


def _save_tiny_gpt2(tokenizer, folder: Path, memorize: str | None = None, n_positions: int = 64) -> Path:
    """Save a 2-layer GPT-2 (optionally overfit on EOS + `memorize` + EOS) with its tokenizer into `folder`."""
    import torch

    from codeparrot.repository.model import ModelConfig, build_model, to_gpt2_config

    cfg = ModelConfig(n_layer=2, n_embd=64, n_head=2, n_positions=n_positions, resid_pdrop=0.0, embd_pdrop=0.0,
                      attn_pdrop=0.0)
    model = build_model(to_gpt2_config(cfg, tokenizer), seed=0)
    if memorize is not None:
        eos = tokenizer.eos_token_id
        ids = torch.tensor([[eos] + tokenizer(memorize, add_special_tokens=False)["input_ids"] + [eos]])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
        model.train()
        for _ in range(150):
            loss = model(ids, attention_mask=torch.ones_like(ids), labels=ids).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
        assert loss.item() < 0.05, f"tiny model failed to memorize (loss {loss.item():.3f})"
    model.eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory, stdlib_texts) -> dict[str, Path]:
    """Folders of tiny saved GPT-2s (2 layers, 64 wide) sharing one 800-token tokenizer trained on stdlib code:
    "memorized" (overfit on `MEMORIZED_CODE`, context 64), "random" (untrained, context 64) and "random_ctx32"
    (untrained, context 32). Built once per session; tests must not write into them."""
    import torch

    from codeparrot.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("tiny-models")
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models train fastest on one thread (2-thread spinning is slow when busy)
    try:
        tok = train_tokenizer(stdlib_texts[:60], vocab_size=800, show_progress=False)
        return {"memorized": _save_tiny_gpt2(tok, root / "memorized", MEMORIZED_CODE),
                "random": _save_tiny_gpt2(tok, root / "random"),
                "random_ctx32": _save_tiny_gpt2(tok, root / "random_ctx32", n_positions=32)}
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module")
def memorized(tiny_models):
    """(model, tokenizer) of the "memorized" tiny model, loaded on the CPU once per test module."""
    from codeparrot.repository.model import load_model_and_tokenizer

    return load_model_and_tokenizer(str(tiny_models["memorized"]), device="cpu")


@pytest.fixture(scope="module")
def one_torch_thread():
    """Torch on one thread for a module of tiny-model tests (2-thread OpenMP spinning is very slow on a busy
    machine); use with `pytestmark = pytest.mark.usefixtures("one_torch_thread")`."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# --- data for the tokenizing datasets (constant-length, pretokenized, factory) ------------------------------
@pytest.fixture(scope="session")
def code_tokenizer(stdlib_texts):
    """A 1,000-token byte-level BPE trained on the first 50 stdlib files (the others are held out)."""
    from codeparrot.tokenizer import train_tokenizer

    return train_tokenizer(stdlib_texts[:50], vocab_size=1000, show_progress=False)


@pytest.fixture(scope="session")
def held_out_code(stdlib_texts) -> list[str]:
    """40 real files `code_tokenizer` was not trained on, each cut after its first ~2,000 characters (at a line
    end) to stay fast: about 700 tokens each."""
    return [t[: t.find("\n", 2000) + 1] or t for t in stdlib_texts[50:90]]


def _write_shards(folder: Path, texts: list[str], n_shards: int) -> Path:
    import gzip
    import json

    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, len(texts), n_shards + 1).astype(int)
    for s in range(n_shards):
        with gzip.open(folder / f"file-{s + 1:012d}.json.gz", "wt", encoding="utf-8") as f:
            for i in range(bounds[s], bounds[s + 1]):
                f.write(json.dumps({"repo_name": "r", "path": f"{i}.py", "content": texts[i]}) + "\n")
    return folder


@pytest.fixture(scope="session")
def write_shards():
    """`write_shards(folder, texts, n_shards) -> folder`: gzip JSONL shards in the preprocess layout
    (file-000000000001.json.gz, ...; contiguous slices of `texts` in order; fields repo_name, path, content)."""
    return _write_shards


def _eos_joined(tokenizer, texts: list[str]):
    import numpy as np

    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return np.array([t for doc in ids for t in doc + [tokenizer.eos_token_id]], dtype=np.int64)


@pytest.fixture(scope="session")
def eos_joined():
    """`eos_joined(tokenizer, texts)`: the reference token stream t1 EOS t2 EOS ... (int64 [n]), from the
    tokenizer's own batch call, never a dataset's helper."""
    return _eos_joined
