"""`preprocess --engine ray` benchmark: the full pipeline (near dedup on) with Ray against the local process pool
on the same export, run alternately (so a busy machine slows both alike), with the per-run ratios, the fixed
cost of starting a local Ray, the scaling row (1 vs 2 Ray CPUs), the two clusterings, and the driver's memory
per input file (`ray_driver`).

Two ways to run the Ray engine, each timed from the call to `preprocess` to its return:
- on a Ray that is already running (as on a cluster, where `ray start` runs once and every job joins it): the
  engine's own per-core throughput, the figure the >= 0.8 target is about;
- with its own private Ray (`preprocess.py --engine ray` without `--ray-address`): the same plus Ray's fixed
  start-up and shutdown, which only a short job notices.

`python -m codeparrot.tools.benchmarks.ray_engine --profile` runs the Ray engine once and prints where the time
went: per task kind its count, CPU-busy seconds and active window, and the busy CPUs second by second
(`ray.timeline`).
"""

from __future__ import annotations

import importlib.util
import json
import sysconfig
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from codeparrot.config import doc
from codeparrot.data.export import export_local
from codeparrot.data.preprocess import PreprocessConfig, preprocess
from codeparrot.tools.benchmarks import ray_driver
from codeparrot.tools.benchmarks.common import AreaFlags, BenchRow, area_cli, measure, print_rows
from codeparrot.tools.benchmarks.data import QUICK_PACKAGES


def _run(raw: Path, out: Path, engine: str, workers: int, running_ray: bool = False, **kw) -> tuple[dict, float]:
    """(stats, seconds) of one run; `running_ray`: a loopback Ray with `workers` CPUs is started first (not
    timed) and shut down after, so the engine joins a running Ray."""
    from codeparrot.data.ray_cluster import ray_shutdown, start_local_ray

    if running_ray:
        start_local_ray(workers)
    try:
        start = time.perf_counter()
        stats = preprocess(PreprocessConfig([str(raw)], str(out), near_dedup=True, num_workers=workers,
                                            progress=False, engine=engine, **kw))
        return stats, time.perf_counter() - start
    finally:
        if running_ray:  # not `ray.shutdown()`: it leaves SIGTERM killing this process, temporary folder and all
            ray_shutdown()


def startup_seconds(workers: int = 2) -> float:
    """Seconds to start a local loopback Ray, run one task and shut it down."""
    from codeparrot.data.ray_cluster import ray_shutdown, start_ray

    start = time.perf_counter()
    start_ray(PreprocessConfig(["-"], "-", num_workers=workers, engine="ray", progress=False))
    import ray

    try:
        ray.get(ray.remote(lambda: 1).remote())
    finally:
        ray_shutdown()
    return time.perf_counter() - start


def _export(work: Path, quick: bool) -> str:
    """Export the benchmark corpus into work/raw; returns its name."""
    if quick:
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        export_local([stdlib / p for p in QUICK_PACKAGES if (stdlib / p).is_dir()], work / "raw", progress=False)
        return "stdlib subset"
    export_local([Path(sysconfig.get_paths()["purelib"])], work / "raw", repo_per_subfolder=True, progress=False)
    return "site-packages"


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def rows(quick: bool = False) -> list[BenchRow]:
    # find_spec, not import: ray must be first imported by start_ray, after its loopback settings are in the
    # environment (start_local_ray refuses a Ray that came up off loopback)
    if importlib.util.find_spec("ray") is None:
        return [BenchRow("preprocess --engine ray", "files/s", float("nan"), float("nan"), float("nan"), 0,
                         "ray not installed: pip install 'codeparrot[distributed]'")]
    repeats = 1 if quick else 3
    out: list[BenchRow] = []
    with tempfile.TemporaryDirectory(prefix="codeparrot-bench-ray-") as tmp:
        work = Path(tmp)
        name = _export(work, quick)
        raw = work / "raw"
        startup = measure(startup_seconds, repeats=repeats)
        out.append(BenchRow("preprocess --engine ray: local Ray start-up + shutdown", "s", *startup, repeats,
                            "fixed cost of a run with its own Ray: ray.init (loopback, 2 CPUs) + one task + shutdown"))
        walls: dict[str, list[float]] = defaultdict(list)
        stats: dict[str, dict] = {}
        for _ in range(repeats):  # the three runs back to back, each repeat
            for label, engine, running in (("local", "local", False), ("running", "ray", True),
                                           ("private", "ray", False)):
                stats[label], wall = _run(raw, work / label, engine, 2, running)
                walls[label].append(wall)
        files = stats["local"]["input_records"]
        local_rate = files / _median(walls["local"])
        for label, what in (("running", "on a running Ray (as on a cluster)"),
                            ("private", "with its own Ray (start-up and shutdown included)")):
            rates = sorted(files / w for w in walls[label])
            out.append(BenchRow(f"preprocess --engine ray, 2 CPUs, {what} ({name})", "files/s", _median(rates),
                                rates[0], rates[-1], repeats,
                                f"{files:,} files, full pipeline with near dedup; local engine (2 workers), run "
                                f"alternately: {local_rate:,.0f} files/s"))
        one, wall = _run(raw, work / "ray1", "ray", 1, True)
        out.append(BenchRow(f"preprocess --engine ray, 1 CPU, on a running Ray ({name})", "files/s", files / wall,
                            float("nan"), float("nan"), 1, "the scaling row: compare with the 2-CPU row above"))
        # --ray-clustering distributed against the driver's clustering of the last running-Ray run (same files)
        dist, _ = _run(raw, work / "distributed", "ray", 2, True, ray_clustering="distributed")
        same = (work / "running" / "duplicate_clusters.json").read_bytes() == (
            work / "distributed" / "duplicate_clusters.json").read_bytes()
        clustered = dist["kept_train"] + dist["kept_valid"] + dist["near_duplicates"]
        for label, run_stats in (("driver", stats["running"]), ("distributed", dist)):
            seconds = run_stats["seconds"]["clustering"]
            out.append(BenchRow(f"preprocess --engine ray: clustering, --ray-clustering {label} ({name})", "us/file",
                                seconds / max(clustered, 1) * 1e6, float("nan"), float("nan"), 1,
                                f"{seconds:.2f} s for {clustered:,} kept files, 2 CPUs"
                                + ("" if label == "driver" else
                                   f"; clusters identical to the driver's: {'yes' if same else 'NO'}")))
        for label, what in (("running", "on a running Ray: per-core throughput (target >= 0.8)"),
                            ("private", "with its own Ray: end to end, Ray's fixed start-up included")):
            ratios = sorted(loc / ray for loc, ray in zip(walls["local"], walls[label]))
            out.append(BenchRow(f"preprocess --engine ray / local, 2 CPUs each, {what} ({name})", "ratio",
                                _median(ratios), ratios[0], ratios[-1], repeats,
                                "local engine's seconds over the Ray engine's, both from the same repeat (local, "
                                "running Ray, own Ray run one after the other); `import ray` (once per process, "
                                "about 0.7 s) is in neither"))
    return out + ray_driver.rows(quick)


def profile(quick: bool = False) -> str:
    """Run the Ray engine once (2 CPUs, on a running Ray) with Ray's task timeline; the table of where the time
    went."""
    from codeparrot.data.ray_cluster import ray_shutdown, start_local_ray

    with tempfile.TemporaryDirectory(prefix="codeparrot-bench-ray-profile-") as tmp:
        work = Path(tmp)
        name = _export(work, quick)
        start_local_ray(2)  # before the first `import ray`: its loopback settings go into the environment first
        import ray

        try:
            start = time.perf_counter()
            stats = preprocess(PreprocessConfig([str(work / "raw")], str(work / "out"), near_dedup=True,
                                                num_workers=2, progress=False, engine="ray"))
            wall = time.perf_counter() - start
            ray.timeline(filename=str(work / "timeline.json"))
        finally:
            ray_shutdown()
        events = [e for e in json.loads((work / "timeline.json").read_text()) if e.get("ph") == "X"]
    tasks = [e for e in events if str(e.get("cat", "")).startswith("task::")]
    t0 = min(e["ts"] for e in tasks)
    kinds: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, float("inf"), 0.0])
    busy: Counter = Counter()  # CPU-seconds of task execution per second of the run
    for e in tasks:
        begin, seconds = (e["ts"] - t0) / 1e6, e["dur"] / 1e6
        k = kinds[e["cat"][len("task::"):]]
        k[0], k[1], k[2], k[3] = k[0] + 1, k[1] + seconds, min(k[2], begin), max(k[3], begin + seconds)
        x = begin
        while x < begin + seconds:
            step = min(int(x) + 1, begin + seconds)
            busy[int(x)] += step - x
            x = step
    lines = [f"{stats['input_records']:,} files ({name}), {wall:.1f} s in preprocess(); tasks from t=0:",
             f"{'task':<22}{'count':>7}{'busy s':>9}{'from s':>9}{'to s':>8}"]
    for task, (count, seconds, first, last) in sorted(kinds.items(), key=lambda kv: kv[1][2]):
        lines.append(f"{task:<22}{count:>7}{seconds:>9.2f}{first:>9.2f}{last:>8.2f}")
    lines.append("busy CPUs per second: " + " ".join(f"{busy[i]:.1f}" for i in range(max(busy) + 1)))
    return "\n".join(lines)


@dataclass
class RayEngineFlags(AreaFlags):
    profile: bool = doc(False, "instead of the rows: run the Ray engine once and print where the time went "
                               "(per task kind, and the busy CPUs second by second)")


def _main(flags: RayEngineFlags) -> None:
    if flags.profile:
        print(profile(quick=flags.quick))
    else:
        print_rows(rows(quick=flags.quick))


if __name__ == "__main__":
    area_cli(__doc__, _main, RayEngineFlags)
