"""`scripts/gpu_check.py --smoke`: every stage runs on this machine (CPU in CI) and writes its figures; the time
budget skips what does not fit; the pieces the smoke run cannot reach on a CPU (out of memory, a CLI that
refuses a flag, CUDA kernel names, JAX) are checked on their own."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from codeparrot.tools.gpu_check.config import STAGES

from ..script_cases import run_cases


@pytest.mark.slow(95)
def test_smoke_runs_every_stage_and_writes_json_and_markdown(repo_root, scripts_env, tmp_path):
    out, spent = tmp_path / "gc", tmp_path / "spent"
    script = repo_root / "scripts" / "gpu_check.py"
    # Four calls in one process (tests/script_cases.py): torch, transformers and the compiled kernels load once.
    # 2: one stage again keeps the others' results (a lease may run the stages one call at a time); 3: a budget
    # already spent skips its stages and keeps their earlier figures; 4: with nothing earlier, records the skips.
    full, again, kept, skipped = run_cases(sys.executable, scripts_env, [
        (script, ["--smoke", "--output-dir", out]),
        (script, ["--smoke", "--output-dir", out, "--stages", "ceilings"]),
        (script, ["--smoke", "--output-dir", out, "--stages", "loss", "--minutes", "1e-9"]),
        (script, ["--smoke", "--output-dir", spent, "--stages", "device", "ceilings", "--minutes", "1e-9"]),
    ], timeout=600)
    assert full.returncode == 0, full.stderr[-3000:]
    results = json.loads((out / "gpu_check.json").read_text())
    stages = results["stages"]
    assert list(STAGES[:5]) == ["device", "headline", "profile", "model_1_5b", "jax"]  # the most important first
    assert set(stages) == set(STAGES)
    assert not [name for name, entry in stages.items() if "error" in entry]
    assert "PaLM" in stages["device"]["result"]["mfu_convention"]

    (auto,) = stages["headline"]["result"]  # smoke: the auto row alone (each CLI run is ~13 s of imports)
    assert auto["requested_micro_batch"] == "auto" and "--batch.micro_batch_size auto" in auto["command"]
    if "error" in auto:  # a CLI that refuses auto: its own one line, not a failed stage
        assert auto["error"].startswith("error:") and "\n" not in auto["error"]
    else:
        assert auto["tokens_per_s"] > 0 and auto["micro_batch"] * auto["accumulation"] == auto["global_batch"] == 8

    prof = stages["profile"]["result"]
    assert prof["steps"] == 1  # smoke: one profiled step (3 on a GPU)
    assert prof["tokens_per_s"] > 0 and sum(c["share"] for c in prof["classes"]) == pytest.approx(1.0)
    top, times = prof["top_kernels"], [k["ms_per_step"] for k in prof["top_kernels"]]
    assert 0 < len(top) <= 15 and times == sorted(times, reverse=True)
    assert sum(k["share"] for k in top) <= 1.0 + 1e-9 and all(k["kernel"] and k["name"] for k in top)

    large = stages["model_1_5b"]["result"]
    assert large["n_layer"] == 48 and [t["micro_batch"] for t in large["trials"]] == [1, 2]
    assert large["micro_batch"] == 2 and not large["activation_checkpointing"] and large["measured"]["tokens_per_s"] > 0

    if importlib.util.find_spec("jax") is None:  # the project's environment: JAX is no dependency
        assert stages["jax"]["skipped"].startswith("skipped: jax is not importable")
    else:
        assert all(r["loss_fell"] and r["torch_over_jax"] > 0 for r in stages["jax"]["result"]["rows"])

    assert stages["ceilings"]["result"]["gemm_bf16_tflops"] > 0
    math_rows = [r for r in stages["attention"]["result"] if r["backend"] == "math"]
    assert math_rows and all(r["ms"] > 0 for r in math_rows)  # the math backend runs everywhere
    losses = {r["variant"]: r for r in stages["loss"]["result"]}
    assert all(r["relative_error"] < 1e-4 for r in losses.values())  # fp32 on a CPU: every variant is exact
    steps = stages["train_step"]["result"]
    assert steps[0]["compile"] == "regional" and all(r["tokens_per_s"] > 0 for r in steps)
    assert all(r["graph_breaks"] == 0 and r["recompiles_while_timed"] == 0 for r in steps)
    e2e = stages["end_to_end"]["result"]  # smoke: 4 steps saved at 2 and 4, resumed from 2 (30 from 20 on a GPU)
    assert e2e["resumed"] and e2e["resume_from_step"] == 2 and e2e["final_step"] == 4
    assert "--max_steps 4 " in e2e["command"]
    assert e2e["max_loss_difference_after_resume"] == 0.0  # exact resume, fp32 on a CPU (steps 3 and 4 compared)
    assert e2e["tokens_per_s"] > 0
    markdown = (out / "gpu_check.md").read_text()
    for heading in ("## Headline", "## Profile", "Top ", "## 1.5B preset", "## Training step",
                    "## End to end (scripts/train.py, 4 steps, then --resume auto from step 2)"):
        assert heading in markdown
    assert "| default: compiled per block, micro-batch 2 |" in markdown

    assert again.returncode == 0, again.stderr[-2000:]
    assert kept.returncode == 0, kept.stderr[-2000:]
    after = json.loads((out / "gpu_check.json").read_text())["stages"]
    assert set(after) == set(stages) and after["loss"] == stages["loss"]
    assert skipped.returncode == 0, skipped.stderr[-2000:]
    assert {name: entry.get("skipped") for name, entry in json.loads((spent / "gpu_check.json").read_text())[
        "stages"].items()} == {"device": "skipped: time budget spent", "ceilings": "skipped: time budget spent"}
    assert "**ceilings: skipped: time budget spent**" in (spent / "gpu_check.md").read_text()


def test_unknown_stage_is_a_one_line_error(repo_root, scripts_env):
    done = subprocess.run([sys.executable, str(repo_root / "scripts" / "gpu_check.py"), "--stages", "warp"],
                          capture_output=True, text=True, env=scripts_env, timeout=120)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "error: --stages: unknown stage 'warp' (known: device, headline, profile, model_1_5b, jax, ceilings, "
        "attention, loss, train_step, end_to_end)"]


def _proc_state(pid: int) -> str:
    """The state letter of /proc/PID/stat ('Z': exited, not yet reaped), or '' when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def test_end_to_end_runs_are_killed_when_the_stage_budget_is_spent(tmp_path):
    import time

    from codeparrot.tools.gpu_check.end_to_end import run_logged

    # As `accelerate launch` runs train.py: a launcher process whose child does the work. Both must go.
    pid_file = tmp_path / "child.pid"
    child = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    launcher = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}])"
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="stage time budget spent: train killed"):
        run_logged([sys.executable, "-c", launcher], tmp_path / "train.log", start + 3)
    assert time.monotonic() - start < 30
    assert pid_file.is_file(), "the child never started: the test proves nothing"
    child_pid = int(pid_file.read_text())
    for _ in range(50):  # SIGKILL is delivered at once; its parent (killed too) no longer waits for it: init reaps it
        if not Path(f"/proc/{child_pid}").exists() or "Z" in _proc_state(child_pid):
            break
        time.sleep(0.1)
    assert not Path(f"/proc/{child_pid}").exists() or "Z" in _proc_state(child_pid), "train.py's process survived"
    with pytest.raises(RuntimeError, match="budget spent before resume started"):
        run_logged([sys.executable, "-c", "pass"], tmp_path / "resume.log", time.monotonic() - 1)


def test_a_stage_still_running_when_the_budget_ends_is_stopped_and_the_call_ends(tmp_path, monkeypatch):
    """--minutes is a hard limit counted from the call's start: a stage no deadline check reaches (a compile, the
    profiled steps) is stopped, recorded as skipped, and the call ends, instead of running on until a `timeout`
    around it kills the whole call; a stage that records the stop in a row and goes on (measure_variant does) is
    stopped again; an alarm set before (pytest-timeout's) is restored."""
    import signal
    import time

    from codeparrot.tools.gpu_check import run
    from codeparrot.tools.gpu_check.config import GpuCheckConfig

    def endless(deadline):  # (ends on its own 5 s after the budget: no hang where nothing stops it)
        while time.monotonic() < deadline + 5:
            time.sleep(0.01)
        return []

    def catches_once(deadline):
        try:
            endless(deadline)
        except RuntimeError:  # as measure_variant records a variant's error, and goes on
            return endless(deadline)

    monkeypatch.setattr(run, "ALARM_GRACE_S", 0.0)
    monkeypatch.setattr(run, "ALARM_REPEAT_S", 0.1)
    monkeypatch.setattr(run, "release", lambda device: None)  # (dynamo's import alone would cost seconds)
    monkeypatch.setattr(run, "stage_functions", lambda ctx: {"ceilings": endless, "loss": catches_once})
    alarm_before = signal.getitimer(signal.ITIMER_REAL)[0]
    for stages in (["ceilings", "loss"], ["loss"]):
        start = time.monotonic()
        cfg = GpuCheckConfig(output_dir=str(tmp_path / stages[0]), stages=stages, smoke=True, minutes=0.3 / 60)
        stages_out = run.run_gpu_check(cfg)["stages"]
        assert time.monotonic() - start < 10
        assert stages_out[stages[0]]["skipped"].startswith("skipped: time budget spent: stopped after ")
        assert "skipped" in json.loads((tmp_path / stages[0] / "gpu_check.json").read_text())["stages"][stages[0]]
    assert stages_out.keys() == {"loss"}
    assert "ceilings" in json.loads((tmp_path / "ceilings" / "gpu_check.json").read_text())["stages"]
    assert json.loads((tmp_path / "ceilings" / "gpu_check.json").read_text())["stages"]["loss"]["skipped"] == (
        "skipped: time budget spent")  # nothing was left for the next stage
    assert (signal.getitimer(signal.ITIMER_REAL)[0] > 0) == (alarm_before > 0)  # none left behind, none lost
    cfg = GpuCheckConfig(output_dir=str(tmp_path / "late"), stages=["ceilings"], smoke=True, minutes=1.0)
    assert run.run_gpu_check(cfg, started=time.monotonic() - 61)["stages"]["ceilings"]["skipped"] == (
        "skipped: time budget spent")  # the budget counts from the start of the call (scripts/gpu_check.py main)


def test_headline_reads_the_batch_the_cli_chose_and_its_one_line_error(tmp_path):
    from codeparrot.tools.gpu_check.end_to_end import error_line
    from codeparrot.tools.gpu_check.headline import chosen_batch, log_tail, row_label

    log, run_dir = tmp_path / "run.log", tmp_path / "run"
    run_dir.mkdir()
    log.write_text("192 sequences/step = auto/process × derived accumulation × 1 process; ...\n"
                   "micro-batch auto: 48 (accumulation 4), the largest of 1, 2, 3 ... that fits\n")
    assert chosen_batch(run_dir, log) == (48, 4)  # the line, when auto wrote no record
    (run_dir / "micro_batch.json").write_text(json.dumps({"micro_batch_size": 96, "accumulation_steps": 2}))
    assert chosen_batch(run_dir, log) == (96, 2)
    log.write_text("192 sequences/step = 12/process × 16 accumulation × 1 process; 196,608 tokens/step\n")
    assert chosen_batch(tmp_path / "elsewhere", log) == (12, 16)
    assert row_label("12", 192) == "micro-batch 12 × 16 accumulation" and row_label("auto", 192) == "micro-batch auto"
    log.write_text("error: --batch.micro_batch_size: expected an integer, got 'auto'\nTraceback (most recent call "
                   "last):\n  ...\nsubprocess.CalledProcessError: Command '[...]' returned non-zero exit status 2.\n")
    assert error_line(log) == "error: --batch.micro_batch_size: expected an integer, got 'auto'"
    log.write_text("".join(f"line {i}\n\n" for i in range(30)))  # the row keeps the end of a failed run's log
    assert log_tail(log) == [f"line {i}" for i in range(10, 30)] and log_tail(tmp_path / "missing.log") == []
    log.write_text("Traceback (most recent call last):\nRuntimeError: boom\n")
    assert error_line(log) == "RuntimeError: boom"


def test_the_cuda_graph_row_runs_with_graphs_and_is_compared_with_its_eager_row(tmp_path):
    from codeparrot.tools.gpu_check.config import GpuCheckConfig, shapes_for
    from codeparrot.tools.gpu_check.headline import compare_with_eager, headline_command, logged_losses, row_label
    from codeparrot.tools.gpu_check.report import _headline

    shapes = shapes_for(GpuCheckConfig())
    assert shapes.headline_micro_batches == ("auto", "auto+graphs", "12")  # the new figures first
    graphed = headline_command(shapes, tmp_path, tmp_path, tmp_path / "run", "auto+graphs", cuda=True)
    eager = headline_command(shapes, tmp_path, tmp_path, tmp_path / "run", "auto", cuda=True)
    assert graphed == eager + ["--cuda_graphs", "true"] and "--cuda_graphs" not in eager
    assert graphed[graphed.index("--batch.micro_batch_size") + 1] == "auto"
    assert row_label("auto+graphs", 192) == "micro-batch auto + CUDA graphs"
    (tmp_path / "metrics.jsonl").write_text('{"step": 2, "loss": 9.5}\n{"step": 2, "val_loss": 9.4}\n'
                                           '{"step": 4, "loss": 9.25}\n')
    assert logged_losses(tmp_path) == [9.5, 9.25] and logged_losses(tmp_path / "none") == []
    rows = [{"row": "12", "requested_micro_batch": "12", "tokens_per_s": 1.0, "losses": [1.0]},
            {"row": "auto", "requested_micro_batch": "auto", "micro_batch": 48, "accumulation": 4,
             "tokens_per_s": 400.0, "losses": [9.5, 9.25]},
            {"row": "auto + CUDA graphs", "requested_micro_batch": "auto+graphs", "micro_batch": 48,
             "accumulation": 4, "tokens_per_s": 500.0, "losses": [9.5, 9.2]}]
    compare_with_eager(rows)
    assert rows[2]["speedup_vs_eager"] == 1.25
    assert rows[2]["loss_max_abs_diff_vs_eager"] == pytest.approx(0.05)
    assert "speedup_vs_eager" not in rows[0] and "speedup_vs_eager" not in rows[1]
    assert "auto + CUDA graphs: 1.250× the eager row's tokens/s; largest logged-loss difference from it 0.05" in (
        "\n".join(_headline(rows)))
    rows[2]["micro_batch"] = 24  # auto chose differently: what the flag gives a user, but other dropout draws
    del rows[2]["loss_max_abs_diff_vs_eager"], rows[2]["speedup_vs_eager"]
    compare_with_eager(rows)
    assert rows[2]["speedup_vs_eager"] == 1.25 and "loss_max_abs_diff_vs_eager" not in rows[2]
    report = "\n".join(_headline(rows))
    assert "auto + CUDA graphs: 1.250× the eager row's tokens/s; largest logged-loss difference from it n/a" in report
    assert "auto chose micro-batch 24 with CUDA graphs and 48 without: losses not compared" in report


def test_the_full_end_to_end_run_is_30_steps_resumed_from_20(tmp_path):
    """What the smoke run shortens (4 steps resumed from 2, one profiled step) stays as it was on a GPU."""
    from codeparrot.tools.gpu_check.config import GpuCheckConfig, shapes_for
    from codeparrot.tools.gpu_check.end_to_end import train_command
    from codeparrot.tools.gpu_check.report import markdown

    shapes = shapes_for(GpuCheckConfig())
    assert shapes.profiled_steps == 3 and shapes.end_to_end_files == 400 and shapes.end_to_end_steps.resume_from == 20
    command = " ".join(train_command(shapes, tmp_path, tmp_path, tmp_path / "run", cuda=True))
    assert ("--max_steps 30 --schedule.warmup_steps 5 --checkpoint.save_steps 10 --checkpoint.push false "
            "--logging.log_steps 5 ") in command and "--data.num_workers 1 " in command
    result = {"command": command, "resume_from_step": 20, "resumed": True, "max_loss_difference_after_resume": 0.0,
              "final_step": 30}
    text = markdown({"run": {}, "stages": {"end_to_end": {"result": result}}})
    assert "## End to end (scripts/train.py, 30 steps, then --resume auto from step 20)" in text


def test_largest_fitting_walks_up_while_it_fits_and_down_while_not():
    from codeparrot.tools.gpu_check.large_model import largest_fitting

    def walk(start, limit, fits_up_to, budget=99):
        tried = []

        def fits(size):
            tried.append(size)
            return size <= fits_up_to

        return (*largest_fitting(start, limit, fits, lambda: len(tried) < budget), tried)

    assert walk(8, 64, 8) == (8, False, [8, 16])  # one 80 GB H100: 8 fits, 16 runs out of memory
    assert walk(8, 64, 20) == (16, False, [8, 16, 32])
    assert walk(8, 64, 100) == (64, False, [8, 16, 32, 64])  # the limit: larger is never tried
    assert walk(8, 64, 3) == (2, False, [8, 4, 2])  # down until one fits, never up again
    assert walk(8, 64, 0) == (0, False, [8, 4, 2, 1])  # nothing fits: the caller turns checkpointing on
    assert walk(8, 64, 100, budget=2) == (16, True, [8, 16])  # out of time: the largest proven so far


def test_the_1_5b_measurement_falls_back_to_smaller_sizes_down_to_one():
    from codeparrot.tools.gpu_check.large_model import measurement_sizes

    assert measurement_sizes(8, [8]) == [8, 4, 2, 1]  # 8 fitted eagerly, compiled it may not: halves until one runs
    assert measurement_sizes(16, [8, 16]) == [16, 8, 4, 2, 1]
    assert measurement_sizes(2, [8, 4, 2]) == [2, 1]  # never a size larger than the chosen one
    assert measurement_sizes(1, [1]) == [1]


def test_a_failed_1_5b_measurement_keeps_the_search_s_trials(monkeypatch):
    """The measurement after the search (compiled, on the GPU) failing otherwise than out of memory (a compile
    error, the budget's end) is recorded, and the trials measured before it are kept (they were lost with the
    whole stage)."""
    import time

    import torch

    from codeparrot.tools.gpu_check import large_model
    from codeparrot.tools.gpu_check.config import GpuCheckConfig, shapes_for

    def fails(self, micro_batch, cfg):
        raise RuntimeError("BackendCompilerFailed: backend='inductor' raised: ...")

    monkeypatch.setattr(large_model.LargeModel, "measure", fails)
    cfg = GpuCheckConfig(smoke=True)
    result = large_model.large_model_stage(shapes_for(cfg), torch.device("cpu"), cfg, time.monotonic() + 60)
    assert [t["micro_batch"] for t in result["trials"]] == [1, 2] and result["micro_batch"] == 2
    assert result["not_measured"] == ("the measurement at micro-batch 2 failed: RuntimeError: BackendCompilerFailed: "
                                      "backend='inductor' raised: ...") and "measured" not in result


def test_kernel_names_are_shortened_to_what_tells_them_apart():
    from codeparrot.tools.gpu_check.kernel_profile import kernel_class, short_kernel_name

    fill = ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> "
            ">(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)")
    assert short_kernel_name(fill) == "vectorized_elementwise_kernel<4, FillFunctor<float>, array<char*, 1ul>>"
    copy = ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::"
            "direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::"
            "operator()() const::{lambda(float)#1}>(at::TensorIteratorBase&, at::native::direct_copy_kernel_cuda("
            "at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::"
            "{lambda(float)#1} const&)::{lambda(int)#1}>(int, at::native::gpu_kernel_impl_nocast<...>)")
    assert short_kernel_name(copy) == "elementwise_kernel<128, 2, gpu_kernel_impl_nocast<direct_copy_kernel_cuda>>"
    adam = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
            "TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, "
            "(at::native::ADAM_MODE)1, false>, float*, double, double>(...)")
    assert short_kernel_name(adam).startswith("multi_tensor_apply_kernel<TensorListMetadata<4>, FusedAdamMathFunctor")
    gemm = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
    assert short_kernel_name(gemm) == gemm[:79] + "…" and len(short_kernel_name(gemm)) == 80
    assert short_kernel_name("triton_per_fused__to_copy_add_native_layer_norm_0") == (
        "triton_per_fused__to_copy_add_native_layer_norm_0")
    assert short_kernel_name("aten::addmm") == "addmm"
    assert [kernel_class(n) for n in (fill, gemm, adam)] == ["memory copy / fill", "matmul (GEMM)", "optimizer"]


def test_the_jax_step_trains(tmp_path):
    """Where jax is installed (the GPU image has it; this project never depends on it): the peer's loss falls."""
    pytest.importorskip("jax")
    import jax

    from codeparrot.tools.gpu_check.jax_step import run_variant

    spec = {"vocab_size": 256, "n_positions": 64, "seq_length": 32, "n_layer": 2, "n_embd": 32, "n_head": 2,
            "dropout": 0.1, "micro_batch": 2, "steps": 4, "warmup_steps": 1, "dtype": "float32", "seed": 0}
    for attention in ("softmax", "fused"):
        row = run_variant(jax, spec, attention)
        assert row["last_loss"] < row["first_loss"] and row["tokens_per_s"] > 0
