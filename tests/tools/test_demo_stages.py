"""`make demo`'s stage bookkeeping (codeparrot/tools/demo.py), with stand-in stages (tiny Python commands): a
finished stage is reused, also after its folder moved; once a stage runs, the ones after it run too; a stage
redone because its command changed starts from scratch, a stopped one continues only if it can resume."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from codeparrot.tools.demo import Stage, run_stages


def _stages(out: Path, producer_text: str = "v1") -> list[Stage]:
    """producer writes a.txt and refuses an existing one, like initialize (a.txt: what it clears); consumer (it
    resumes) appends a line to work/log.txt (a run folder) and copies a.txt to b.txt; it clears work/."""
    produce = ("import os, sys; sys.exit(3) if os.path.exists(sys.argv[1]) else "
               "open(sys.argv[1], 'w').write(sys.argv[2])")
    consume = ("import os, shutil, sys; os.makedirs(sys.argv[1], exist_ok=True); "
               "open(os.path.join(sys.argv[1], 'log.txt'), 'a').write('ran\\n'); shutil.copy(sys.argv[2], sys.argv[3])")
    return [Stage("producer", [sys.executable, "-c", produce, str(out / "a.txt"), producer_text], [out / "a.txt"],
                  clears=[out / "a.txt"]),
            Stage("consumer", [sys.executable, "-c", consume, *(str(out / n) for n in ("work", "a.txt", "b.txt"))],
                  [out / "b.txt"], clears=[out / "work"], resumes=True)]


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


def _stopped(out: Path, name: str) -> None:
    """What a stop leaves: the stage's record without a finish time."""
    record = out / ".stages" / f"{name}.json"
    record.write_text(json.dumps({"command": json.loads(record.read_text())["command"], "finished": None}))


def test_a_stopped_stage_continues_if_it_resumes_and_starts_over_otherwise(tmp_path):
    out = tmp_path / "demo"
    out.mkdir()
    run_stages(out, _stages(out), "make demo")
    (out / "b.txt").unlink()
    _stopped(out, "consumer")
    assert run_stages(out, _stages(out), "make demo")[1] == {"producer"}
    assert _runs(out) == 2  # its folder (a training run's checkpoints) was kept
    # a stage that cannot resume starts over, its leftovers cleared, also when a stop came before its record
    (out / ".stages" / "producer.json").unlink()
    assert run_stages(out, _stages(out), "make demo")[1] == set()
    assert (out / "b.txt").read_text() == "v1" and _runs(out) == 1


def test_a_stop_passed_to_a_stage_that_still_finishes_stops_the_pipeline(tmp_path, scripts_env):
    # training that gets the SIGTERM in its last step finishes with status 0: the next stage must not start
    out = tmp_path / "demo"
    first = ("import signal, sys, time; from pathlib import Path\n"
             "signal.signal(signal.SIGTERM, lambda *_: (Path(sys.argv[1]).write_text('done'), sys.exit(0)))\n"
             "print('stage ready', flush=True); time.sleep(60)")
    program = (f"import sys\nfrom pathlib import Path\nfrom codeparrot.errors import run_cli\n"
               f"from codeparrot.tools.demo import Stage, run_stages\nout = Path({str(out)!r}); out.mkdir()\n"
               f"stages = [Stage('first', [sys.executable, '-c', {first!r}, str(out / 'a')], [out / 'a']),\n"
               f"          Stage('second', [sys.executable, '-c', 'open(sys.argv[1], \"w\")', str(out / 'b')],"
               f" [out / 'b'])]\nrun_cli(lambda: run_stages(out, stages, 'make demo') and 0)\n")
    proc = subprocess.Popen([sys.executable, "-c", program], env=scripts_env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    while proc.stdout.readline() not in ("stage ready\n", ""):  # after the stage's command line
        pass
    proc.send_signal(signal.SIGTERM)
    out_text, err = proc.communicate(timeout=30)
    assert proc.returncode == 143 and not (out / "b").exists(), (out_text, err)
    assert err.splitlines() == ["demo stage 'first' was stopped (re-run `make demo` to resume from it)",
                                "stopped by SIGTERM"], err
    assert json.loads((out / ".stages" / "first.json").read_text())["finished"]  # done: reused next time
