"""`make demo`'s stage bookkeeping (codeparrot/tools/demo.py), with stand-in stages (tiny Python commands): a
finished stage is reused, also after its folder moved; once a stage runs, the ones after it run too; a stage
redone because its command changed starts from scratch, one that did not finish continues."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from codeparrot.tools.demo import Stage, run_stages


def _stages(out: Path, producer_text: str = "v1") -> list[Stage]:
    """producer writes a.txt; consumer appends a line to work/log.txt (a run folder it would resume) and copies
    a.txt to b.txt; its cleared folder is work/."""
    produce = "import sys; open(sys.argv[1], 'w').write(sys.argv[2])"
    consume = ("import os, shutil, sys; os.makedirs(sys.argv[1], exist_ok=True); "
               "open(os.path.join(sys.argv[1], 'log.txt'), 'a').write('ran\\n'); shutil.copy(sys.argv[2], sys.argv[3])")
    return [Stage("producer", [sys.executable, "-c", produce, str(out / "a.txt"), producer_text], [out / "a.txt"]),
            Stage("consumer", [sys.executable, "-c", consume, *(str(out / n) for n in ("work", "a.txt", "b.txt"))],
                  [out / "b.txt"], clears=[out / "work"])]


def _runs(out: Path) -> int:
    return (out / "work" / "log.txt").read_text().count("ran")


def test_reused_when_done_also_after_the_folder_moved(tmp_path):
    out = tmp_path / "demo"
    out.mkdir()
    assert run_stages(out, _stages(out), "make demo")[1] == set()
    moved = tmp_path / "moved"
    shutil.move(out, moved)
    assert run_stages(moved, _stages(moved), "make demo")[1] == {"producer", "consumer"}
    assert _runs(moved) == 1


def test_a_changed_stage_reruns_everything_after_it_from_scratch(tmp_path):
    out = tmp_path / "demo"
    out.mkdir()
    run_stages(out, _stages(out), "make demo")
    # the producer's command changed: it runs, and the consumer runs again on its new output, its old folder gone
    assert run_stages(out, _stages(out, "v2"), "make demo")[1] == set()
    assert (out / "b.txt").read_text() == "v2" and _runs(out) == 1


def test_an_unfinished_stage_continues_instead_of_starting_over(tmp_path):
    out = tmp_path / "demo"
    out.mkdir()
    run_stages(out, _stages(out), "make demo")
    (out / "b.txt").unlink()  # as if it had been stopped before its output was complete
    (out / ".stages" / "consumer.json").unlink()
    assert run_stages(out, _stages(out), "make demo")[1] == {"producer"}
    assert _runs(out) == 2  # its folder (a training run's checkpoints) was kept
