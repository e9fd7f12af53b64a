"""`preprocess --engine ray` benchmark: the full pipeline (near dedup on) with Ray Data against the local process
pool on the same export, the fixed cost of starting a local Ray, and the scaling row (1 vs 2 Ray workers).

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
from codeparrot.tools.benchmarks.common import BenchRow, measure
from codeparrot.tools.benchmarks.data import QUICK_PACKAGES


def _run(raw: Path, out: Path, engine: str, workers: int) -> tuple[dict, float]:
    start = time.perf_counter()
    stats = preprocess(PreprocessConfig([str(raw)], str(out), near_dedup=True, num_workers=workers, progress=False,
                                        engine=engine))
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
        local_stats, local_wall = _run(work / "raw", work / "local", "local", 2)
        files = local_stats["input_records"]
        for workers in (2, 1):
            walls: list[float] = []

            def once(workers=workers, walls=walls) -> float:
                stats, wall = _run(work / "raw", work / f"ray{workers}", "ray", workers)
                walls.append(wall)
                return stats["input_records"] / wall

            median, low, high = measure(once, repeats=repeats if workers == 2 else 1)
            steady = files / max(sorted(walls)[len(walls) // 2] - startup[0], 1e-9)
            note = (f"{files:,} files, full pipeline with near dedup; {steady:,.0f} files/s without the start-up; "
                    f"local engine (2 workers): {files / local_wall:,.0f} files/s")
            out.append(BenchRow(f"preprocess --engine ray, {workers} worker{'s' * (workers > 1)} ({name})",
                                "files/s", median, low, high, len(walls), note))
    return out


if __name__ == "__main__":
    import sys

    for row in rows(quick="--quick" in sys.argv):
        print(row)
