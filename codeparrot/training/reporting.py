"""What the training loop reports: a fixed-format console line, metrics.jsonl, and Accelerate's trackers (`log`
writes one entry to both); `--profile-steps` adds a torch.profiler trace (`start_profiler`).

Trackers (TensorBoard, W&B) are optional comforts: one that fails to start is a warning, never a dead run.
W&B runs offline (files under the run folder, `wandb sync` later) unless a `WANDB_API_KEY` is set. Nothing
secret reaches a tracker or a file: configs are redacted (keys that name a token/secret/password, values
that look like Hugging Face tokens, credentials inside URLs: `codeparrot.redaction`) before they are logged.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import warnings
from pathlib import Path
from typing import Any

import torch

from codeparrot.atomic_io import atomic_write_json, atomic_write_text
from codeparrot.redaction import scrub_secrets

# Key names that hold credentials: `token` alone or as a credential's name (hf_token, hub_token,
# access_token, ...), api keys, passwords, secrets. Deliberately not any key containing "token": settings such
# as `tokenizer`, `chars_per_token` or `max_new_tokens` must survive into the saved config.
_SECRET_KEY = re.compile(
    r"^(?:(?:[a-z0-9]+[_.-])*(?:hf|hub|huggingface|auth|access|bearer|api|wandb|user|org|github|gh|refresh|id)[_.-]?)?"
    r"tokens?$|(?:^|[_.-])(?:api[_.-]?keys?|secrets?|passwords?|passwd|credentials?)$", re.IGNORECASE)
def redact(value: Any, key: str = "") -> Any:
    """A copy of a (nested) config with every secret-looking key or value replaced by '***'."""
    if isinstance(value, dict):
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v, key) for v in value]
    if key and _SECRET_KEY.search(key) and value not in (None, "", False):
        return "***"
    if isinstance(value, str):
        return scrub_secrets(value)
    return value


def flatten(config: dict, prefix: str = "") -> dict[str, Any]:
    """{'optim': {'lr': 1}} -> {'optim.lr': 1}, lists as strings: what TensorBoard's hparams accept."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        elif value is None or isinstance(value, (list, tuple)):
            out[name] = str(value)
        else:
            out[name] = value
    return out


def configure_wandb_env() -> None:
    """W&B offline unless the user has a key (or chose a mode); never an interactive login prompt."""
    if not os.environ.get("WANDB_API_KEY") and not os.environ.get("WANDB_MODE"):
        os.environ["WANDB_MODE"] = "offline"
    os.environ.setdefault("WANDB_SILENT", "true")


def start_trackers(accelerator, names: list[str], project: str, config: dict, run_dir: Path, run_name: str) -> list[str]:
    """Start each tracker on its own so that one failing (missing package, no network) only warns.

    Returns the names that started. `config` must already be redacted."""
    started = []
    init_kwargs = {"wandb": {"dir": str(run_dir), "name": run_name}}
    requested = list(names)
    for name in requested:
        before = len(accelerator.trackers)
        accelerator.log_with = [name]  # init_trackers starts everything in log_with; one at a time here
        try:
            accelerator.init_trackers(project, config=flatten(config), init_kwargs=init_kwargs)
            started.append(name)
        except Exception as err:  # any tracker failure must not stop training
            del accelerator.trackers[before:]
            warnings.warn(f"tracker {name} could not start ({type(err).__name__}: {err}); training continues without it")
    accelerator.log_with = started
    return started


class MetricsFile:
    """`metrics.jsonl` in the run folder: one JSON object per logged dict (main process only writes)."""

    def __init__(self, run_dir: Path, enabled: bool):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.enabled = enabled

    def truncate_after(self, step: int) -> None:
        """On resume: drop entries the killed run logged after the checkpoint, so each step appears once."""
        if not self.enabled or not self.path.is_file():
            return
        kept = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                if json.loads(line).get("step", 0) <= step:
                    kept.append(line)
            except ValueError:
                continue  # a line cut by the kill
        atomic_write_text(self.path, "".join(f"{line}\n" for line in kept))

    def append(self, entry: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")


def memory_gib(device: torch.device) -> float:
    """Peak GPU memory allocated by tensors, or the process's resident memory on CPU, in GiB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    try:
        import psutil

        return psutil.Process().memory_info().rss / 2**30
    except ImportError:  # pragma: no cover - psutil comes with accelerate
        return float("nan")


def console_line(m: dict[str, Any], max_steps: int) -> str:
    """The fixed-format training line, e.g.
    `step    100/1000 | loss 3.4512 | lr 4.99e-04 | grad-norm 0.812 | 245.3 ms/step | 8,351 tok/s | MFU 31.2% | mem 1.23 GiB`
    with ` | warm-up` at the end of the first window of a run (see `ThroughputWindows`)."""
    width = len(str(max_steps))
    mfu = "   n/a" if m.get("mfu") is None else f"{100 * m['mfu']:5.1f}%"
    grad = "n/a" if m.get("grad_norm") is None else f"{m['grad_norm']:.3f}"
    return (f"step {m['step']:>{width}}/{max_steps} | loss {m['loss']:.4f} | lr {m['lr']:.2e} | grad-norm {grad} | "
            f"{m['ms_per_step']:7.1f} ms/step | {m['tokens_per_s']:>9,.0f} tok/s | MFU {mfu} | "
            f"mem {m['memory_gib']:.2f} GiB" + (f" | skipped {m['skipped_steps']}" if m.get("skipped_steps") else "")
            + (" | warm-up" if m.get("warmup") else ""))


MFU_CONVENTION = "PaLM appendix B: 6N + 12LHQT FLOPs/token"


class ThroughputWindows:
    """The run's throughput, window by window (one window = the steps between two log lines, evaluation and
    checkpoint time excluded). The first window of every process start (a fresh run or a resume) holds the
    compile, the DataLoader workers' start-up and the allocator's warm-up: it is marked `"warmup": true` in
    metrics.jsonl and on the console, and left out of the summary, which is the median over the other windows."""

    def __init__(self) -> None:
        self.windows: list[dict[str, Any]] = []

    def add(self, entry: dict[str, Any]) -> dict[str, Any]:
        """Mark `entry` (a training log entry with tokens_per_s, mfu, memory_gib) as warm-up or not; returns it."""
        entry["warmup"] = not self.windows
        self.windows.append(entry)
        return entry

    def summary(self, peak: float | None, peak_source: str) -> dict[str, Any]:
        """Median tokens/s and MFU over the windows after the warm-up (None when there are none), peak memory."""
        timed = [w for w in self.windows if not w["warmup"]]
        mfus = [w["mfu"] for w in timed if w.get("mfu") is not None]
        return {"windows": len(timed), "warmup_windows_excluded": len(self.windows) - len(timed),
                "median_tokens_per_s": statistics.median(w["tokens_per_s"] for w in timed) if timed else None,
                "median_mfu": statistics.median(mfus) if mfus else None, "mfu_convention": MFU_CONVENTION,
                "peak_tflops_per_device": None if peak is None else peak / 1e12, "peak_source": peak_source,
                "peak_memory_gib": max((w["memory_gib"] for w in self.windows), default=None)}

    def write(self, run_dir: Path, peak: float | None, peak_source: str) -> str:
        """Write `<run>/throughput.json` (atomically) and return the one-line summary for the console."""
        s = self.summary(peak, peak_source)
        atomic_write_json(Path(run_dir) / "throughput.json", s)
        if s["median_tokens_per_s"] is None:
            return (f"throughput: n/a, only the warm-up window was logged ({s['warmup_windows_excluded']} window(s)); "
                    "run more steps than logging.log_steps for a figure")
        mfu = "n/a (no peak for this device)" if s["median_mfu"] is None else f"{100 * s['median_mfu']:.1f}%"
        return (f"throughput (median of {s['windows']} log window(s) after the warm-up one): "
                f"{s['median_tokens_per_s']:,.0f} tokens/s, MFU {mfu} ({MFU_CONVENTION}; peak {peak_source}), "
                f"peak memory {s['peak_memory_gib']:.2f} GiB")


def log(accelerator, metrics: MetricsFile, entry: dict) -> None:
    """One logged dict: metrics.jsonl (main process) and every started tracker."""
    metrics.append(entry)
    tracked = {k: v for k, v in entry.items() if k not in ("step", "warmup") and v is not None}
    accelerator.log(tracked, step=entry["step"])


def start_profiler(run_dir: Path, device: torch.device):
    """A torch.profiler trace into the run's TensorBoard folder (open with the PyTorch profiler plugin)."""
    from torch.profiler import ProfilerActivity, profile, tensorboard_trace_handler

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    profiler = profile(activities=activities, record_shapes=True, profile_memory=True,
                       on_trace_ready=tensorboard_trace_handler(str(run_dir / "tensorboard" / "profile")))
    profiler.start()
    return profiler
