"""Checkpoints and resumes in-process, on a 1-layer GPT-2 and one CPU Accelerator (no training run): what is on disk
before a checkpoint is published, leftovers of killed saves, file modes, a resume from an older checkpoint of a
run, the micro-step counter, the RNG states, the data position under another micro-batch, the optimizer settings
of the config, the non-finite guard's counters, the checkpoint every process resumes from (processes as threads)
and the setup a checkpoint must be resumed under. The kill-and-resume runs are in test_resume.py, damaged
checkpoints in test_checkpoint_verification.py."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from codeparrot.errors import CodeParrotError
from codeparrot.training import checkpointing
from codeparrot.training.checkpointing import (
    TrainerState,
    list_checkpoints,
    read_data_position,
    resolve_resume,
    restore_training_state,
    save_checkpoint,
)
from codeparrot.training.config import OptimConfig, ScheduleConfig
from codeparrot.training.nonfinite import NonFiniteGuard
from codeparrot.training.optim import apply_on_resume, build_optimizer, build_scheduler, lr_factor

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def tiny(fresh_accelerate_state):
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, n_positions=8, vocab_size=16))
    optimizer = build_optimizer(model, OptimConfig(lr=1e-3), accelerator.device)
    scheduler = build_scheduler(optimizer, 10, ScheduleConfig(warmup_steps=2))
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    return SimpleNamespace(accelerator=accelerator, model=model, optimizer=optimizer, scheduler=scheduler)


def _save(tiny, run_dir: Path, step: int, keep_last: int = 5, data_state: dict | None = None,
          micro_batch_size: int = 2, nonfinite: dict | None = None) -> Path:
    state = TrainerState(step, 16 * step, 1, "tiny", nonfinite=nonfinite or {})
    return save_checkpoint(tiny.accelerator, tiny.model, None, run_dir, state, data_state or {},
                           {"batch": {"micro_batch_size": micro_batch_size}}, keep_last)


def test_a_checkpoint_is_on_disk_before_it_is_published_and_before_pruning(tiny, tmp_path, monkeypatch):
    """Without fsync a power loss after the rename can leave the new step-N with empty files while keep_last
    has already deleted the previous, good checkpoint."""
    _save(tiny, tmp_path, 1, keep_last=1)
    events = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def rename(src, dst, *args, **kwargs):
        events.append(("rename", str(src), str(dst)))
        return real_rename(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    _save(tiny, tmp_path, 2, keep_last=1)
    root = tmp_path / "checkpoints"
    partial = root / ".step-2.partial"
    publish = events.index(("rename", str(partial), str(root / "step-2")))
    prune = events.index(("rename", str(root / "step-1"), str(root / ".step-1.deleting")))
    synced_before = {e[1] for e in events[:publish] if e[0] == "fsync"}
    for name in ["model.safetensors", "config.json", "training_state/optimizer.bin",
                 "training_state/scheduler.bin", "training_state/random_states_0.pkl",
                 "training_state/data_rank0.pt", "trainer_state.json", "manifest.json", "training_state", "."]:
        assert str((partial / name).resolve()) in synced_before, name
    assert ("fsync", str(root.resolve())) in events[publish:prune]  # the rename itself, before step-1 goes
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2]


def test_a_save_removes_what_killed_saves_and_deletes_left_at_other_steps(tiny, tmp_path):
    """A SIGTERM save cut by the SIGKILL after it leaves `.step-N.partial` at a step never saved again, a prune cut
    by a kill `.step-K.deleting`: each up to a checkpoint's size, and they used to stay for good."""
    root = tmp_path / "checkpoints"
    (root / ".step-7123.partial" / "training_state").mkdir(parents=True)
    (root / ".step-1.deleting").mkdir()
    (root / "notes").mkdir()  # not ours: kept
    _save(tiny, tmp_path, 8000)
    assert sorted(p.name for p in root.iterdir()) == ["notes", "step-8000"]


def test_weights_are_readable_like_the_files_beside_them(tiny, tmp_path):
    from codeparrot.training.model_io import save_final_model

    old = os.umask(0o022)
    try:
        folder = _save(tiny, tmp_path, 1)
        save_final_model(tiny.accelerator, tiny.model, None, tmp_path / "final")
    finally:
        os.umask(old)
    for path in (folder / "model.safetensors", tmp_path / "final" / "model.safetensors"):
        assert path.stat().st_mode & 0o777 == 0o644, path  # the safetensors writer makes 0600
    assert (folder / "config.json").stat().st_mode & 0o777 == 0o644


def test_resuming_an_older_checkpoint_of_a_run_with_later_ones_is_refused(tiny, tmp_path):
    """Its saves would interleave with the later checkpoints: keep_last would delete the new ones first (the one
    just written too) and `--resume auto` would continue the abandoned later ones."""
    for step in (1, 2, 3):
        _save(tiny, tmp_path, step)
    root = tmp_path / "checkpoints"
    with pytest.raises(CodeParrotError, match=r"cannot resume from .*step-1: .* also holds later checkpoints of this "
                                              r"run \(step-2, step-3\).*move them out of that folder first"):
        resolve_resume(str(root / "step-1"), tmp_path)
    assert resolve_resume(str(root / "step-3"), tmp_path) == root / "step-3"
    assert resolve_resume(str(root / "step-1"), tmp_path / "another-run") == root / "step-1"  # a fork: no mixing
    assert resolve_resume("auto", tmp_path) == root / "step-3"


def test_a_resume_starts_at_micro_step_0_whatever_the_accumulation(tiny, tmp_path):
    """Accelerate restores its raw micro-step count (steps × the old accumulation): with another accumulation the
    last micro-step of the first step would not synchronize (the loop's assertion after the whole set-up)."""
    acc = tiny.accelerator
    acc.step = 6  # 3 optimizer steps of 2 micro-steps
    folder = _save(tiny, tmp_path, 3)
    acc.gradient_accumulation_steps = 4
    restore_training_state(acc, folder)
    syncs = []
    for _ in range(4):
        with acc.accumulate(tiny.model):
            syncs.append(acc.sync_gradients)
    assert syncs == [False, False, False, True]


def test_rng_states_are_restored_or_the_resume_fails(tiny, tmp_path):
    folder = _save(tiny, tmp_path, 1)
    expected = torch.rand(4)
    torch.manual_seed(123)
    restore_training_state(tiny.accelerator, folder)
    assert torch.equal(torch.rand(4), expected)

    # written with numpy 1.x (its pickles name numpy.core): Accelerate cannot load it and used to go on quietly
    rng = folder / "training_state" / "random_states_0.pkl"
    with zipfile.ZipFile(rng) as old:
        entries = [(info, old.read(info.filename)) for info in old.infolist()]
    with zipfile.ZipFile(rng, "w", compression=zipfile.ZIP_STORED) as new:
        for info, data in entries:
            new.writestr(info, data.replace(b"numpy._core", b"numpy.core") if info.filename.endswith(".pkl") else data)
    with pytest.raises(CodeParrotError, match=r"random_states_0.pkl: the random number generator states cannot "
                                              r"be restored \(UnpicklingError: WeightsUnpickler error: Unsupported "
                                              r"global: GLOBAL numpy.core.multiarray._reconstruct was not an allowed "
                                              r"global by default\); an exact resume needs them$"):
        restore_training_state(tiny.accelerator, folder)


def test_a_data_position_replayed_in_other_micro_batches_is_refused(tiny, tmp_path):
    """A loader with workers replays the batches since its workers' last snapshot in batches of the new size."""
    lagging = _save(tiny, tmp_path / "a", 1, data_state={"_steps_since_snapshot": 4, "_snapshot": {}},
                    micro_batch_size=2)
    with pytest.raises(CodeParrotError, match=r"batch.micro_batch_size 2, this run has 4: .* replays the 4 batch\(es\) "
                                              r".* would skip 8 sequence\(s\): resume with --batch.micro_batch_size 2"):
        read_data_position(lagging, 0, 4)
    with pytest.raises(CodeParrotError, match=r"would repeat 4 sequence\(s\)"):
        read_data_position(lagging, 0, 1)
    assert read_data_position(lagging, 0, 2)["_steps_since_snapshot"] == 4
    exact = _save(tiny, tmp_path / "b", 1, data_state={"_steps_since_snapshot": 0, "_snapshot": {}})
    assert read_data_position(exact, 0, 4)["_steps_since_snapshot"] == 0  # nothing replayed: any micro-batch


def _optimizer_pair(lr: float, weight_decay: float, max_steps: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    optimizer = build_optimizer(model, OptimConfig(lr=lr, weight_decay=weight_decay), torch.device("cpu"))
    return model, optimizer, build_scheduler(optimizer, max_steps, ScheduleConfig(warmup_steps=2))


def test_a_resume_uses_the_configs_optimizer_settings_and_schedule():
    """The optimizer's and scheduler's state dicts bring back the checkpoint's lr, weight decay and next rate."""
    model, optimizer, scheduler = _optimizer_pair(1e-3, 0.1, 10)
    for _ in range(4):
        model(torch.ones(2, 4)).sum().backward()
        optimizer.step()
        scheduler.step()
    saved = optimizer.state_dict(), scheduler.state_dict()

    _, same_opt, same_sched = _optimizer_pair(1e-3, 0.1, 10)  # the same config: nothing changes
    same_opt.load_state_dict(saved[0])
    same_sched.load_state_dict(saved[1])
    assert apply_on_resume(same_opt, same_sched, OptimConfig(lr=1e-3, weight_decay=0.1)) == []
    assert same_opt.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]

    _, new_opt, new_sched = _optimizer_pair(5e-4, 0.01, 20)  # lower lr and weight decay, max_steps raised
    new_opt.load_state_dict(saved[0])
    new_sched.load_state_dict(saved[1])
    changes = apply_on_resume(new_opt, new_sched, OptimConfig(lr=5e-4, weight_decay=0.01))
    assert changes == ["optim.lr 0.001 (the checkpoint's) -> 0.0005 (the config's)",
                       "optim.weight_decay 0.1 (the checkpoint's) -> 0.01 (the config's)"]
    rate = 5e-4 * lr_factor(4, 20, ScheduleConfig(warmup_steps=2))
    assert [g["lr"] for g in new_opt.param_groups] == [rate, rate] and new_sched.get_last_lr() == [rate, rate]
    assert [g["weight_decay"] for g in new_opt.param_groups] == [0.01, 0.0]
    assert torch.equal(new_opt.state_dict()["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"])
    new_sched.step()
    assert new_opt.param_groups[0]["lr"] == 5e-4 * lr_factor(5, 20, ScheduleConfig(warmup_steps=2))


def test_a_run_of_bad_steps_goes_on_counting_across_a_resume(tiny, tmp_path):
    """An uninterrupted run stops at the max_bad_steps-th bad step in a row; a resume in the middle of the run of
    bad steps used to start counting from 0 again."""
    stub = SimpleNamespace(reduce=lambda tensor, reduction: tensor, mixed_precision="no")
    metrics, loader = SimpleNamespace(append=lambda entry: None), SimpleNamespace(state_dict=lambda: {})

    def guard():
        return NonFiniteGuard(stub, 3, 0, 1, "data", loader, metrics)

    before = guard()
    nan = torch.tensor(float("nan"))
    with pytest.warns(UserWarning):
        assert before.check(2, torch.tensor(1.0), nan) is False and before.check(3, nan, torch.tensor(1.0)) is False
    folder = _save(tiny, tmp_path, 3, nonfinite=before.state_dict())
    after = guard()
    after.load_state_dict(checkpointing.read_state(folder).nonfinite)
    assert after.skipped == 2
    with pytest.warns(UserWarning), pytest.raises(CodeParrotError, match="3 steps in a row .* the first at step 2 "):
        after.check(4, torch.tensor(1.0), nan)


def test_a_damaged_later_checkpoint_does_not_crowd_out_the_new_ones(tiny, tmp_path):
    """`--resume auto` skips a damaged step-5 and resumes from step-1; the new saves must survive keep_last (the
    damaged one, the highest step, used to count as the newest: the new ones were pruned and the next `auto` found
    nothing usable). Re-saving a step exchanges the folders, and one set aside by a crash between two renames
    (a filesystem without the exchange) is put back before `auto` looks."""
    _save(tiny, tmp_path, 1, keep_last=1)
    (_save(tiny, tmp_path, 5, keep_last=5) / "model.safetensors").write_bytes(b"damaged")
    warnings = []
    assert resolve_resume("auto", tmp_path, report=warnings.append) == tmp_path / "checkpoints" / "step-1"
    assert "skipped step-5" in warnings[0]
    _save(tiny, tmp_path, 2, keep_last=1)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 5]
    assert resolve_resume("auto", tmp_path, report=warnings.append) == tmp_path / "checkpoints" / "step-2"
    _save(tiny, tmp_path, 5, keep_last=1)  # the run reaches step 5: the damaged folder is replaced
    assert [s for s, _ in list_checkpoints(tmp_path)] == [5]
    assert resolve_resume("auto", tmp_path, report=warnings.append) == tmp_path / "checkpoints" / "step-5"
    root = tmp_path / "checkpoints"
    os.rename(root / "step-5", root / f".step-5.old-{dead_owner()}")  # killed between the fallback's renames
    assert resolve_resume("auto", tmp_path, report=warnings.append) == root / "step-5"


def dead_owner() -> str:
    """This machine with a pid that runs no process: a dead owner of this host (`atomic_io._owner`'s format)."""
    from codeparrot import atomic_io

    host = atomic_io._owner().split("-", 1)[0]
    return f"{host}-{2**22 + 12345}"


# ---- a resume: the checkpoint the main process chose, on every process; a setup it can load ----
def _save_two_process_checkpoint(tiny, run_dir: Path, step: int) -> Path:
    """A checkpoint as 2 processes write it (rank 1's files copied from rank 0's), verified like a real one."""
    from codeparrot.training.checkpointing import write_manifest

    folder = save_checkpoint(tiny.accelerator, tiny.model, None, run_dir, TrainerState(step, 16 * step, 2, "tiny"),
                             {}, {}, 5)
    state = folder / "training_state"
    for name in ("data_rank{}.pt", "random_states_{}.pkl"):
        (state / name.format(1)).write_bytes((state / name.format(0)).read_bytes())
    write_manifest(folder)
    return folder


class ThreadGroup:
    """Processes as threads, with the two collectives `choose_resume` uses; rank 0 is started first and `between`
    runs once it waits in the first collective (its decision made). A rank left waiting fails after 10 s (a
    BrokenBarrierError) instead of hanging the test."""

    def __init__(self, world: int):
        import threading

        self.barrier, self.slots, self.world = threading.Barrier(world, timeout=10), [None] * world, world

    def broadcast(self, rank: int):
        def send(obj):
            if rank == 0:
                self.slots[0] = obj
            self.barrier.wait()
            value = self.slots[0]
            self.barrier.wait()
            return value
        return send

    def gather(self, rank: int):
        def collect(obj):
            self.slots[rank] = obj
            self.barrier.wait()
            values = list(self.slots)
            self.barrier.wait()
            return values
        return collect

    def run(self, body, between=lambda: None) -> list:
        import threading
        import time

        results: list = [None] * self.world

        def target(rank):
            try:
                results[rank] = body(rank, self.broadcast(rank), self.gather(rank))
            except BaseException as err:  # noqa: BLE001 - compared by the test
                results[rank] = err

        threads = [threading.Thread(target=target, args=(rank,)) for rank in range(self.world)]
        threads[0].start()
        deadline = time.monotonic() + 10
        while self.barrier.n_waiting < 1 and threads[0].is_alive() and time.monotonic() < deadline:
            time.sleep(0.001)
        between()
        for thread in threads[1:]:
            thread.start()
        for thread in threads:
            thread.join(30)
        return results


def test_every_process_resumes_from_the_checkpoint_the_main_process_chose(tiny, tmp_path):
    """Each process used to resolve `--resume auto` itself: one seeing the shared run folder through a stale
    attribute cache (here: rank 1's own view holds only step-1) trained on from another checkpoint, silently."""
    from codeparrot.training.resume_checks import choose_resume

    run_dir, stale = tmp_path / "run", tmp_path / "stale-view"
    _save_two_process_checkpoint(tiny, run_dir, 1)
    chosen = _save_two_process_checkpoint(tiny, run_dir, 2)
    _save_two_process_checkpoint(tiny, stale, 1)
    views = {0: run_dir, 1: stale}

    def resume(rank, broadcast, gather):
        return choose_resume("auto", views[rank], world=2, main=rank == 0, max_steps=10, broadcast=broadcast,
                             gather=gather)

    for point in ThreadGroup(2).run(resume):
        assert not isinstance(point, BaseException), point
        assert (point.checkpoint, point.state.step, point.finished) == (chosen, 2, False)


def test_a_checkpoint_a_process_cannot_use_fails_every_process_with_one_line(tiny, tmp_path):
    """Pruned (or not yet visible) on rank 1 after rank 0 chose it; rank 0's own error, too, reaches every
    process: no process waits in a collective for one that failed."""
    import shutil

    from codeparrot.training.resume_checks import choose_resume

    chosen = _save_two_process_checkpoint(tiny, tmp_path, 2)

    def resume(rank, broadcast, gather):
        return choose_resume("auto", tmp_path, world=2, main=rank == 0, max_steps=10, broadcast=broadcast,
                             gather=gather)

    results = ThreadGroup(2).run(resume, between=lambda: shutil.rmtree(chosen))
    assert all(isinstance(r, CodeParrotError) for r in results), results
    assert str(results[0]) == str(results[1]) == (
        f"cannot resume from {chosen}, the checkpoint the main process chose: process 1: resume checkpoint {chosen} "
        "does not exist or is not a folder (every process must see the run folder as the main process does: one "
        "shared filesystem)")

    _save_two_process_checkpoint(tiny, tmp_path, 2)  # written by 2 processes, resumed by 3: rank 0 refuses it
    results = ThreadGroup(3).run(lambda rank, broadcast, gather: choose_resume(
        "auto", tmp_path, world=3, main=rank == 0, max_steps=10, broadcast=broadcast, gather=gather))
    assert [str(r) for r in results] == [f"{chosen} was written by 2 processes; resume it with that many, not 3 "
                                         "(each process has its own data position)"] * 3


def test_a_resume_under_another_sharding_or_into_fp16_is_refused_at_start(tiny, tmp_path):
    """Each used to end in an Accelerate FileNotFoundError traceback once the model was prepared (DDP <-> FSDP,
    FSDP sharded <-> full state dict: checked with 2 CPU processes; fp16 needs scaler.pt). What Accelerate loads
    correctly stays allowed: another data-parallel type, bf16 <-> no (float32 weights and optimizer state
    either way), fp16 -> bf16."""
    import json

    from codeparrot.training.checkpointing import read_state, run_setup
    from codeparrot.training.resume_checks import check_resume_setup, saved_setup

    folder = _save(tiny, tmp_path, 1)
    now = run_setup(tiny.accelerator)
    assert read_state(folder).setup == now == {"distributed_type": "NO", "mixed_precision": "no",
                                               "grad_scaler": False, "fsdp_state_dict_type": None,
                                               "fsdp_version": None}
    assert check_resume_setup(folder, saved_setup(folder, read_state(folder)), now) == []

    def setup(**changes):
        return {**now, **changes}

    fsdp = setup(distributed_type="FSDP", fsdp_state_dict_type="SHARDED_STATE_DICT", fsdp_version=2)
    ddp, fp16 = setup(distributed_type="MULTI_GPU"), setup(mixed_precision="fp16", grad_scaler=True)
    with pytest.raises(CodeParrotError, match=r"^cannot resume from .*step-1: it was saved under distributed type "
                                              r"FSDP, this run is MULTI_GPU: the optimizer state and model in its "
                                              r"training_state/ cannot be loaded under another; launch it with the "
                                              r"Accelerate config it was saved with, or start a new run from its "
                                              r"weights \(--model .*step-1 --revision null --run_name NEW"):
        check_resume_setup(folder, fsdp, ddp)
    with pytest.raises(CodeParrotError, match="saved under distributed type MULTI_GPU, this run is FSDP"):
        check_resume_setup(folder, ddp, fsdp)
    with pytest.raises(CodeParrotError, match=r"saved with fsdp_state_dict_type SHARDED_STATE_DICT, this run has "
                                              r"FULL_STATE_DICT: .* launch with fsdp_state_dict_type: "
                                              r"SHARDED_STATE_DICT in the Accelerate config"):
        check_resume_setup(folder, fsdp, {**fsdp, "fsdp_state_dict_type": "FULL_STATE_DICT"})
    with pytest.raises(CodeParrotError, match=r"saved with mixed_precision bf16, this run has fp16, whose loss "
                                              r"scaler needs the state \(scaler.pt\) only an fp16 checkpoint holds; "
                                              r"resume with --mixed_precision bf16"):
        check_resume_setup(folder, setup(mixed_precision="bf16"), fp16)
    assert check_resume_setup(folder, ddp, now) == []  # MULTI_GPU -> one process (of a matching checkpoint)
    assert check_resume_setup(folder, {**fsdp, "fsdp_version": 1}, fsdp) == []  # not refused: DCP either way
    assert check_resume_setup(folder, setup(mixed_precision="bf16"), now) == [
        "mixed_precision bf16 (the checkpoint's) -> no (this run's)"]
    assert check_resume_setup(folder, fp16, setup(mixed_precision="bf16")) == [
        "mixed_precision fp16 (the checkpoint's) -> bf16 (this run's)"]

    # saved before the setup was recorded: read off Accelerate's files
    data = json.loads((folder / "trainer_state.json").read_text())
    del data["setup"]
    (folder / "trainer_state.json").write_text(json.dumps(data))
    assert check_resume_setup(folder, saved_setup(folder, read_state(folder)), now) == []
    (folder / "training_state" / "pytorch_model_fsdp_0").mkdir()
    with pytest.raises(CodeParrotError, match="saved under distributed type FSDP, this run is NO"):
        check_resume_setup(folder, saved_setup(folder, read_state(folder)), now)
    with pytest.raises(CodeParrotError, match=r"saved with mixed_precision bf16 or no, this run has fp16.* resume with "
                                              r"--mixed_precision bf16 \(or no\)"):
        check_resume_setup(folder, saved_setup(folder, read_state(folder)), {**fsdp, "mixed_precision": "fp16",
                                                                             "grad_scaler": True})
