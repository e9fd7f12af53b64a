"""`preprocess --engine ray` benchmark: the full pipeline (near dedup on) with Ray Data against the local process
pool on the same export, run alternately (so a busy machine slows both alike) with the per-run ratio, the fixed
cost of starting a local Ray, the scaling row (1 vs 2 Ray workers), and the driver's memory per input file
(`ray_driver`).

Every run starts its own loopback-only Ray with `num_workers` CPUs (as `preprocess.py --engine ray` does
without `--ray-address`), so the files/s include the start-up; the note also gives the rate without it.
"""

from __future__ import annotations

import importlib.util
import sysconfig
import tempfile
import time
from pathlib import Path

from codeparrot.data.export import export_local
from codeparrot.data.preprocess import PreprocessConfig, preprocess
from codeparrot.tools.benchmarks import ray_driver
from codeparrot.tools.benchmarks.common import BenchRow, measure
from codeparrot.tools.benchmarks.data import QUICK_PACKAGES


def _run(raw: Path, out: Path, engine: str, workers: int, **kw) -> tuple[dict, float]:
    start = time.perf_counter()
    stats = preprocess(PreprocessConfig([str(raw)], str(out), near_dedup=True, num_workers=workers, progress=False,
                                        engine=engine, **kw))
    return stats, time.perf_counter() - start


def startup_seconds(workers: int = 2) -> float:
    """Seconds to start a local loopback Ray, run a one-block Ray Data job and shut it down."""
    from codeparrot.data.ray_cluster import start_ray

    start = time.perf_counter()
    start_ray(PreprocessConfig(["-"], "-", num_workers=workers, engine="ray", progress=False))
    import ray
    import ray.data

    ray.data.range(8, override_num_blocks=1).count()
    ray.shutdown()
    return time.perf_counter() - start


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
        if quick:
            stdlib = Path(sysconfig.get_paths()["stdlib"])
            name, sources, per_repo = "stdlib subset", [stdlib / p for p in QUICK_PACKAGES if (stdlib / p).is_dir()], False
        else:
            name, sources, per_repo = "site-packages", [Path(sysconfig.get_paths()["purelib"])], True
        export_local(sources, work / "raw", repo_per_subfolder=per_repo, progress=False)
        startup = measure(startup_seconds, repeats=repeats)
        out.append(BenchRow("preprocess --engine ray: local Ray start-up + shutdown", "s", *startup, repeats,
                            "fixed cost per run: ray.init (loopback, 2 CPUs) + a one-block job + shutdown"))
        local_walls: list[float] = []
        ratios: list[float] = []
        files = 0
        ray_stats: dict[int, dict] = {}  # workers -> stats.json of the latest Ray run
        for workers in (2, 1):
            walls: list[float] = []

            def once(workers=workers, walls=walls) -> float:
                nonlocal files
                if workers == 2:  # the local engine right before, on the same machine state
                    stats, wall = _run(work / "raw", work / "local", "local", 2)
                    local_walls.append(wall)
                stats, wall = _run(work / "raw", work / f"ray{workers}", "ray", workers)
                ray_stats[workers] = stats
                walls.append(wall)
                files = stats["input_records"]
                if workers == 2:
                    ratios.append(local_walls[-1] / wall)
                return files / wall

            median, low, high = measure(once, repeats=repeats if workers == 2 else 1)
            steady = files / max(sorted(walls)[len(walls) // 2] - startup[0], 1e-9)
            local_rate = files / sorted(local_walls)[len(local_walls) // 2]
            note = (f"{files:,} files, full pipeline with near dedup; {steady:,.0f} files/s without the start-up; "
                    f"local engine (2 workers), run alternately: {local_rate:,.0f} files/s")
            out.append(BenchRow(f"preprocess --engine ray, {workers} worker{'s' * (workers > 1)} ({name})",
                                "files/s", median, low, high, len(walls), note))
        # --ray-clustering distributed against the driver's clustering of the last 2-worker run (same files)
        driver_stats = ray_stats[2]
        dist_stats, _ = _run(work / "raw", work / "ray-distributed", "ray", 2, ray_clustering="distributed")
        same = (work / "ray2" / "duplicate_clusters.json").read_bytes() == (
            work / "ray-distributed" / "duplicate_clusters.json").read_bytes()
        clustered = dist_stats["kept_train"] + dist_stats["kept_valid"] + dist_stats["near_duplicates"]
        for label, stats in (("driver", driver_stats), ("distributed", dist_stats)):
            seconds = stats["seconds"]["clustering"]
            out.append(BenchRow(f"preprocess --engine ray: clustering, --ray-clustering {label} ({name})", "us/file",
                                seconds / max(clustered, 1) * 1e6, float("nan"), float("nan"), 1,
                                f"{seconds:.2f} s for {clustered:,} kept files, 2 CPUs"
                                + ("" if label == "driver" else
                                   f"; clusters identical to the driver's: {'yes' if same else 'NO'}")))
        ratios.sort()
        out.append(BenchRow(f"preprocess --engine ray / local, 2 workers each ({name})", "ratio",
                            ratios[len(ratios) // 2], ratios[0], ratios[-1], len(ratios),
                            "per-core throughput of the Ray engine over the local engine's, each pair run back to "
                            "back (target >= 0.8)"))
    return out + ray_driver.rows(quick)


if __name__ == "__main__":
    import sys

    for row in rows(quick="--quick" in sys.argv):
        print(row)
