"""`--engine ray` on a real 2-node Ray cluster started with the `ray start` CLI: a head and a worker node, 1 CPU
each, each started from its own working directory, inside a private network namespace (`unshare -n`: only
loopback exists, so nothing can leave the machine). The driver (`scripts/preprocess.py --ray-address`) runs
from a third working directory. Relative and absolute paths give the local engine's exact bytes; an output
folder one node cannot see is refused in one line before any work; a worker node killed mid-run changes
nothing. Skipped with the reason where namespaces (root or user namespaces) are not available."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from codeparrot.data.preprocess import PreprocessConfig, preprocess
from codeparrot.data.ray_pass1 import FAULT_MARKER_ENV

pytestmark = pytest.mark.slow(40)  # a 2-node Ray cluster: first in `make test`'s order

# find_spec, not an import: ray must be first imported after the private-Ray loopback settings (conftest's
# `ray_session`), and the cluster here is driven by subprocesses only
if importlib.util.find_spec("ray") is None:
    pytest.skip("ray is not installed: pip install 'codeparrot[distributed]'", allow_module_level=True)

RAY_CLI = Path(sys.executable).with_name("ray")
PORT = 6379  # the head's GCS port inside the private namespace (no other process can hold it there)
DECIDED = ("shards", "clusters", "counts")


def _namespaces_available() -> str | None:
    """None when `unshare -n -p -f -m` works here, else why not."""
    if shutil.which("unshare") is None or shutil.which("nsenter") is None or shutil.which("ip") is None:
        return "unshare, nsenter or ip (util-linux, iproute2) is not installed"
    if not RAY_CLI.exists():
        return f"the ray CLI is not next to {sys.executable}"
    try:
        done = subprocess.run(["unshare", "-n", "-p", "-f", "-m", "--mount-proc", "true"], capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"unshare failed: {err}"
    return None if done.returncode == 0 else f"private namespaces are not available: {done.stderr.strip()[:200]}"


def _clean_env(root: Path) -> dict[str, str]:
    """This interpreter's environment without Ray settings (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, which the
    private-Ray tests set, forbids multi-node), with this checkout importable on every node and a token of
    its own (Ray's token authentication; the same token on every node and the driver)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(PYTHONPATH=str(Path(__file__).resolve().parents[2]), RAY_USAGE_STATS_ENABLED="0",
               RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=(root / "token").read_text(), HF_HUB_OFFLINE="1")
    return env


class Cluster:
    """A head and a worker node in a private network namespace; `run` starts a process inside it."""

    def __init__(self, root: Path):
        self.root = root
        (root / "token").write_text(secrets.token_hex(16))
        self.env = _clean_env(root)
        self.temp = Path(tempfile.mkdtemp(prefix="cpray-", dir="/tmp"))  # short: Ray's unix socket paths
        for name in ("head", "worker", "private"):
            (root / name).mkdir()
        start = (f"{RAY_CLI} start --node-ip-address 127.0.0.1 --num-cpus 1 --disable-usage-stats "
                 f"--temp-dir {self.temp}")
        # The worker node runs in a mount namespace of its own where `private/` is an empty tmpfs: a folder
        # that looks like the others' but is not shared storage.
        script = "\n".join([
            "set -e", "ip link set lo up",
            # a dead node is noticed after ~2 s, not Ray's default ~30 s (the node-kill test waits for it)
            "export RAY_health_check_period_ms=500 RAY_health_check_timeout_ms=500 RAY_health_check_failure_threshold=3",
            f"cd {root / 'head'} && {start} --head --port {PORT} --include-dashboard false > head.log 2>&1",
            f"cd {root / 'worker'} && unshare -m sh -c 'mount -t tmpfs tmpfs {root / 'private'} && "
            f"{start} --address 127.0.0.1:{PORT} > worker.log 2>&1'",
            "echo READY", "exec sleep 100000"])
        self.proc = subprocess.Popen(["unshare", "-n", "-p", "-f", "-m", "--mount-proc", "bash", "-c", script],
                                     env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        line = self.proc.stdout.readline()
        if line.strip() != "READY":
            self.close()
            logs = "".join(p.read_text()[-1500:] for p in root.glob("*/*.log"))
            raise RuntimeError(f"the cluster did not start: {self.proc.stderr.read()[-1500:]}{logs}")
        self.ns_pid = int(Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()[0])

    def run(self, *args: str, cwd: Path, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
        return subprocess.run(["nsenter", "-t", str(self.ns_pid), "-n", "--", *args], cwd=cwd,
                              env={**self.env, **(env or {})}, capture_output=True, text=True, timeout=timeout)

    def preprocess(self, *args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
        script = Path(__file__).resolve().parents[2] / "scripts" / "preprocess.py"
        return self.run(sys.executable, str(script), "--engine", "ray", "--ray-address", f"127.0.0.1:{PORT}",
                        "--no-progress", *args, cwd=cwd, env=env)

    def worker_raylet(self) -> int:
        """Process id of the worker node's raylet (the one started without --head)."""
        for proc in Path("/proc").iterdir():
            try:
                cmd = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmd and cmd[0].endswith(b"/raylet") and str(self.temp).encode() in b" ".join(cmd) \
                    and b"--head" not in cmd:
                return int(proc.name)
        raise AssertionError("the worker node's raylet is not running")

    def close(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)  # the namespace's pid 1 goes, and every process in it
        self.proc.wait(timeout=60)
        shutil.rmtree(self.temp, ignore_errors=True)


def _alive(pid: int) -> bool:
    """A running process (not gone, not a zombie waiting for the namespace's init, `sleep`, to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except (OSError, IndexError):
        return False


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = _namespaces_available()
    if why:
        pytest.skip(why)
    cluster = Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="module")
def corpus(cluster, stdlib_texts) -> Path:
    """`data/in/`: two export files of stdlib code with exact and near duplicates planted across them."""
    folder = cluster.root / "data" / "in"
    folder.mkdir(parents=True)
    rows = [{"repo_name": f"r{i % 7}", "path": f"m{i}.py", "content": t} for i, t in enumerate(stdlib_texts[:90])]
    planted = [{**rows[3], "path": "copy.py", "content": rows[3]["content"].replace("\n", "\n\n")},
               *({**rows[5], "path": f"fork{k}.py", "content": rows[5]["content"] + f"\nfork_{k} = {k}\n"}
                 for k in range(3))]
    (folder / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:50]))
    (folder / "b.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in planted + rows[50:])
                                                      .encode(), mtime=0))
    return folder


def _decided(out: Path) -> dict:
    """What a run decided: each shard's name and sha256, duplicate_clusters.json's bytes, stats counts."""
    stats = json.loads((out / "stats.json").read_text())
    return {"shards": {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
                       for p in sorted(out.rglob("*.json.gz"))},
            "clusters": (out / "duplicate_clusters.json").read_bytes(),
            "counts": {k: v for k, v in stats.items() if k not in ("seconds", "files_per_second", "mb_per_second",
                                                                   "config", "index_bytes_per_file")},
            "entries": sorted(str(p.relative_to(out)) for p in out.rglob("*"))}


@pytest.fixture(scope="module")
def local(corpus, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("local") / "out"
    preprocess(PreprocessConfig([str(corpus)], str(out), near_dedup=True, num_workers=1, valid_fraction=0.2,
                                samples_per_file=16, progress=False))
    return _decided(out)


FLAGS = ("--near-dedup", "--valid-fraction", "0.2", "--samples-per-file", "16")


def test_relative_paths_from_a_third_working_directory_give_the_local_bytes(cluster, corpus, local):
    """`--input in --output-dir out-rel` from data/: the head and the worker run from head/ and worker/, where
    those names resolve elsewhere; the run must read and write data/'s folders (it used to write the shards
    under each node's own working directory and publish an empty output)."""
    done = cluster.preprocess("--input", "in", "--output-dir", "out-rel", *FLAGS, cwd=corpus.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    assert local["counts"]["kept_train"] > 32 and local["counts"]["near_duplicates"] >= 2
    assert _decided(corpus.parent / "out-rel") == local
    assert not list((cluster.root / "head").glob(".out-rel*")) and not list((cluster.root / "worker").glob(".out*"))


def test_an_output_folder_a_node_does_not_share_is_refused_before_any_work(cluster, corpus):
    done = cluster.preprocess("--input", str(corpus), "--output-dir", str(cluster.root / "private" / "out"), *FLAGS,
                              cwd=cluster.root)
    assert done.returncode != 0
    message = done.stderr.strip().splitlines()[-1]
    assert "cannot write into the output folder" in message and "every node shares" in message, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert not (cluster.root / "private" / "out").exists() and not list((cluster.root / "private").iterdir())


def test_a_worker_node_killed_mid_run_changes_nothing(cluster, corpus, local):
    """Absolute paths; when the first filter task starts (it then kills its own worker process, see
    FAULT_MARKER_ENV), the whole worker node (its raylet and every worker on it) is SIGKILLed: Ray reruns the
    lost tasks on the head and the output is still the local engine's, byte for byte."""
    marker, raylet = cluster.root / "fault-marker", cluster.worker_raylet()

    def kill_the_worker_node() -> None:
        deadline = time.monotonic() + 240
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(raylet, signal.SIGKILL)

    killer = threading.Thread(target=kill_the_worker_node, daemon=True)
    killer.start()
    done = cluster.preprocess("--input", str(corpus), "--output-dir", str(cluster.root / "out-abs"), *FLAGS,
                              cwd=cluster.root / "head", env={FAULT_MARKER_ENV: str(marker)})
    killer.join(timeout=5)
    assert marker.exists() and not _alive(raylet)  # the node did die during the run
    assert done.returncode == 0, done.stderr[-3000:]
    assert _decided(cluster.root / "out-abs") == local
