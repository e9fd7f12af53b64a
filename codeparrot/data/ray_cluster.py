"""Where the Ray engine runs (`codeparrot.data.ray_engine`): a private loopback-only Ray started by this
process, or a cluster it joins; and, on a cluster, the check at start that every node sees the same inputs
and can write into the output folder this process will publish.

Private Ray: without `--ray-address`, or with `--ray-address local` (Ray's own name for "start a new local
instance"), a Ray is started with `--num-workers` CPUs, no dashboard and no usage statistics, every server of
it (GCS, raylet, workers, runtime-env agent) listening on 127.0.0.1 only, and shut down at the end; a Ray
already initialized in this process (tests) is used as is. `RAY_ADDRESS` in the environment does not turn a
private start into a join: the start passes `address="local"` explicitly.

SIGTERM (`run_cli`: the CLI unwinds, removes its temporary output, says `stopped by SIGTERM`, status 143): Ray
takes it over. `ray.init` installs its own handler (`sys.exit(15)`: status 15, no message), its core adds a crash
handler that prints a stack dump for it, and `ray.shutdown` leaves SIGTERM at its default action (what is left of
the run is killed, its temporary output folder stays). A SIGTERM while Ray starts its processes also left some of
them running after this process had gone. So `ray_init` keeps Ray from installing its handler and puts the CLI's
back after the start, holding a SIGTERM that arrives while a private Ray starts (then it stops that Ray and
passes the held SIGTERM on; a join is stopped at once), and `ray_shutdown` puts it back after the shutdown.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import sys
import threading
from pathlib import Path

from codeparrot.data.hub_input import HubInput
from codeparrot.data.preprocess_config import PreprocessConfig
from codeparrot.errors import CodeParrotError, first_line

# Ray reads these when it is imported. A single-node Ray normally advertises the machine's outward address
# (127.0.0.1 passed as the node address is rewritten to it) and its gRPC servers then listen on every
# interface. With the "cluster" switch off, the node address is the loopback address and the GCS, raylet and
# worker servers bind 127.0.0.1 only (checked from /proc/net/tcp in tests/data/test_ray_engine.py). The same
# switch forbids other nodes from joining, so it is never set when joining a cluster.
LOCAL_RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
PRIVATE_ADDRESSES = (None, "", "local")  # --ray-address values that start a private Ray
NODE_CHECK_SECONDS = 120  # a node that does not answer the start check in this time refuses the run


def is_private(cfg: PreprocessConfig) -> bool:
    return cfg.ray_address in PRIVATE_ADDRESSES


def _install_sigterm(handler) -> None:
    """`handler` (what `signal.getsignal` returned) installed for SIGTERM, at the C level too; None (a handler set
    outside Python, which Python cannot put back) becomes the default action. Main thread only."""
    signal.signal(signal.SIGTERM, handler if handler is not None else signal.SIG_DFL)


def _reinstall_sigterm_handler() -> None:
    """This process's Python SIGTERM handler installed again, in place of what Ray's core left at the C level (its
    crash handler, or SIG_DFL after `ray.shutdown`). Only the main thread can; elsewhere nothing changes."""
    if threading.current_thread() is threading.main_thread():
        _install_sigterm(signal.getsignal(signal.SIGTERM))


def ray_shutdown() -> None:
    """`ray.shutdown()`, this process's SIGTERM handler kept (module docstring)."""
    import ray

    ray.shutdown()
    _reinstall_sigterm_handler()


def ray_init(hold_sigterm: bool, **kwargs) -> None:
    """`ray.init(**kwargs)` that keeps this process's SIGTERM handler (module docstring). `hold_sigterm` (a
    private Ray started here): a SIGTERM during the start is held until Ray is up, then that Ray is shut down and
    the SIGTERM goes to the handler put back. Without it (a join: nothing is started here) the handler acts at
    once, also during a join to an address that never answers."""
    import ray

    if threading.current_thread() is not threading.main_thread():  # only the main thread has signal handlers
        ray.init(**kwargs)
        return
    ray_utils = getattr(getattr(ray, "_private", None), "utils", None)  # imported by `import ray`

    held: list[int] = []
    previous = signal.getsignal(signal.SIGTERM)
    if hold_sigterm:
        signal.signal(signal.SIGTERM, lambda signum, frame: held.append(signum))
    rays_own = getattr(ray_utils, "set_sigterm_handler", None)  # what ray.init installs its own handler with
    if rays_own is not None:
        ray_utils.set_sigterm_handler = lambda handler: None
    try:
        ray.init(**kwargs)
    finally:
        if rays_own is not None:
            ray_utils.set_sigterm_handler = rays_own
        _install_sigterm(previous)
        if held:
            if ray.is_initialized():
                ray_shutdown()  # before the stop unwinds: nothing of the Ray started here stays behind
            signal.raise_signal(signal.SIGTERM)


def start_local_ray(num_cpus: int) -> None:
    """Start a private, loopback-only Ray in this process: `num_cpus` CPUs, no dashboard, no usage stats.
    `LOCAL_RAY_ENV` must be in the environment before `ray` is first imported; a Ray whose node came up on
    another address is shut down again with a one-line error, never used."""
    if "ray" not in sys.modules:
        os.environ.update(LOCAL_RAY_ENV)
    import ray

    ray_init(True, address="local", num_cpus=max(num_cpus, 1), include_dashboard=False, log_to_driver=False)
    address = ray.util.get_node_ip_address()
    if not ipaddress.ip_address(address).is_loopback:
        ray_shutdown()
        raise CodeParrotError(f"the local Ray came up on {address}, not on loopback: ray was imported before "
                              f"{' and '.join(f'{k}={v}' for k, v in LOCAL_RAY_ENV.items())} were set")


def start_ray(cfg: PreprocessConfig) -> bool:
    """Join `cfg.ray_address` or start a private loopback-only Ray; True if this call connected or started it."""
    private = is_private(cfg)
    for key, value in (LOCAL_RAY_ENV.items() if private else [("RAY_USAGE_STATS_ENABLED", "0")]):
        os.environ.setdefault(key, value)  # read when ray is first imported: before the import
    try:
        import ray
    except ImportError:
        raise CodeParrotError("--engine ray needs Ray: pip install 'codeparrot[distributed]'") from None
    if ray.is_initialized():
        return False
    if private:
        start_local_ray(cfg.num_workers)
        return True
    try:
        ray_init(False, address=cfg.ray_address, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise CodeParrotError(f"cannot join the Ray cluster at {cfg.ray_address}: {first_line(err)}") from None
    return True


# --- the start check: every node sees the inputs and the output folder ---------------------------------------

def _node_view(files: list[tuple[str, int]], folders: list[str], out: str, probe: str) -> tuple[list[str], bool]:
    """Ray task pinned to one node: (what is wrong there, whether it wrote the file `probe` into `out`). The
    driver must then see that file: the folder is shared, not a same-named folder on the node's own disk."""
    problems = []
    for path, size in files:
        try:
            here = os.path.getsize(path)
        except OSError as err:
            problems.append(f"input {path}: {err.strerror or err}")
            continue
        if here != size:
            problems.append(f"input {path} has {here:,} bytes here, {size:,} on the driver")
        elif not os.access(path, os.R_OK):
            problems.append(f"input {path} is not readable")
    problems += [f"{folder} is not a folder here" for folder in folders if not os.path.isdir(folder)]
    try:
        with open(os.path.join(out, probe), "x") as f:
            f.write(probe)
    except OSError as err:
        problems.append(f"cannot write into the output folder {out}: {err.strerror or err}")
        return problems, False
    return problems, True


def check_nodes(paths: list[Path | HubInput], tokenizer: str | None, tmp: Path) -> None:
    """On a joined cluster, before any work: one tiny task on every alive node checks that it sees each input
    file (same size as here), each local dataset or tokenizer folder, and can write into the temporary output
    folder `tmp`, and this process checks it sees what each node wrote there. Refuses in one line otherwise."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    files = [(str(p), os.path.getsize(p)) for p in paths if not isinstance(p, HubInput)]
    folders = [h.dataset_id for h in paths if isinstance(h, HubInput) and os.path.isdir(h.dataset_id)]
    folders += [tokenizer] if tokenizer and os.path.isdir(tokenizer) else []
    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
    view = ray.remote(num_cpus=0, max_retries=0)(_node_view)
    refs = {}
    for node in nodes:
        where = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        refs[node["NodeID"]] = view.options(scheduling_strategy=where).remote(
            files, folders, str(tmp), f".node-check-{node['NodeID'][:16]}")
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=NODE_CHECK_SECONDS)
    problems = []
    for node in nodes:
        name, ref = f"node {node['NodeManagerAddress']} ({node['NodeID'][:8]})", refs[node["NodeID"]]
        if ref not in ready:
            problems.append(f"{name}: no answer in {NODE_CHECK_SECONDS} s")
            continue
        seen, wrote = ray.get(ref)
        problems += [f"{name}: {problem}" for problem in seen]
        probe = tmp / f".node-check-{node['NodeID'][:16]}"
        if probe.exists():
            probe.unlink()
        elif wrote:
            problems.append(f"{name}: wrote into {tmp} but this machine does not see it")
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise CodeParrotError(f"the Ray cluster cannot run this job: {problems[0]}{more}; inputs, --tokenizer and "
                              "--output-dir must be on storage every node shares, at the same path")
