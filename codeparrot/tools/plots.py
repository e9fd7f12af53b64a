"""PNG charts of a run: training curves, what preprocessing removed, validation loss across checkpoints.

Built on matplotlib's object API with the Agg renderer (`Figure` + `savefig`, never `pyplot`), so plotting
needs no display, does not touch a caller's pyplot state and is safe from any thread. Every PNG is written
to a temporary sibling and renamed, so a crash never leaves half an image.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from codeparrot.atomic_io import cannot_write
from codeparrot.errors import CodeParrotError

STYLE = {"font.size": 12, "axes.titlesize": 15, "axes.titleweight": "bold", "axes.labelsize": 12.5,
         "legend.fontsize": 11, "xtick.labelsize": 11, "ytick.labelsize": 11, "axes.grid": True,
         "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False, "savefig.dpi": 120}
BLUE, ORANGE, GREEN, RED, GREY, PURPLE = "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#7f7f7f", "#9467bd"


# -------------------------------------------------------------------------------------------- helpers
def _figure(width: float = 9.0, height: float = 5.0):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _save(fig, png: str | os.PathLike) -> Path:
    """Render `fig` to `png` atomically (temporary file in the same folder, then rename); a failed write is one
    line naming `png` (`cannot_write`)."""
    png = Path(png)
    try:
        png.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{png.name}.tmp-", suffix=".png", dir=png.parent)
    except OSError as err:
        raise cannot_write(png, err) from err
    os.close(fd)
    try:
        fig.savefig(tmp, format="png")
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; an image is for everyone who can read the folder
        os.replace(tmp, png)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise cannot_write(png, err) from err
        raise
    return png


def _si(x: float, _pos: Any = None) -> str:
    """1234567 -> '1.23M': readable token counts and rates on an axis."""
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.3g}"


def _ema(values: Sequence[float], span: int) -> list[float]:
    """Exponential moving average that skips NaNs (so a diverged step does not poison the curve)."""
    alpha, out, avg = 2 / (span + 1), [], None
    for v in values:
        if math.isfinite(v):
            avg = v if avg is None else alpha * v + (1 - alpha) * avg
        out.append(avg if avg is not None else math.nan)
    return out


def _num(value: Any) -> float:
    """A metric value as float; missing, null or non-numeric becomes NaN (a gap in the line)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return math.nan
    return v if math.isfinite(v) else math.nan


def _integer_steps(ax) -> None:
    """Optimizer steps are whole numbers: never put a tick at step 99.25."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _ticks_si(axis) -> None:
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(_si))


# ------------------------------------------------------------------------------------------- training
def read_metrics(metrics_jsonl: str | os.PathLike) -> tuple[list[dict], list[dict]]:
    """(train records, eval records) from `metrics.jsonl`, each sorted by step with one record per step.

    A train record has `loss`, an eval record `val_loss`. When a step appears twice (a resumed run that
    re-logged it) the later line wins. Unparseable lines (e.g. the last line of a killed run) are skipped
    with one warning naming the first of them.
    """
    path = Path(metrics_jsonl)
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as err:
        raise CodeParrotError(f"{path}: {err.strerror or err}") from None
    train: dict[int, dict] = {}
    evals: dict[int, dict] = {}
    bad: list[int] = []
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            step = int(rec["step"])
        except (ValueError, KeyError, TypeError):
            bad.append(no)
            continue
        if "val_loss" in rec:
            evals[step] = rec
        if "loss" in rec:
            train[step] = rec
    if bad:
        # a plain line: a UserWarning would name this module's source line before the user's file
        print(f"warning: {path}: skipped {len(bad)} unreadable line(s), first at line {bad[0]}", file=sys.stderr)
    return [train[s] for s in sorted(train)], [evals[s] for s in sorted(evals)]


def plot_training(metrics_jsonl: str | os.PathLike, out_dir: str | os.PathLike) -> list[Path]:
    """Training charts from a run's `metrics.jsonl` into `out_dir`; returns the PNGs written.

    - `loss.png`: train loss (raw and smoothed) and validation loss vs tokens seen (vs step if the log has
      no token counts);
    - `learning_rate.png`: the schedule vs step;
    - `throughput.png`: tokens/s vs step, with MFU on a second axis when logged;
    - `grad_norm.png`: gradient norm vs step, when logged.
    A chart whose data is absent is not drawn; no training and no validation records is a `CodeParrotError`.
    """
    from matplotlib import rc_context

    train, evals = read_metrics(metrics_jsonl)
    if not train and not evals:
        raise CodeParrotError(f"{metrics_jsonl}: no training (loss) or validation (val_loss) records to plot")
    run = Path(metrics_jsonl).resolve().parent.name
    out_dir = Path(out_dir)
    written = []
    with rc_context(STYLE):
        written.append(_plot_loss(train, evals, out_dir / "loss.png", run))
        for key, name, fn in (("lr", "learning_rate.png", _plot_lr), ("tokens_per_s", "throughput.png", _plot_speed),
                              ("grad_norm", "grad_norm.png", _plot_grad_norm)):
            if any(math.isfinite(_num(r.get(key))) for r in train):
                written.append(fn(train, out_dir / name, run))
    return written


def _token_axis(train: list[dict], evals: list[dict]) -> tuple[str, dict[int, float]]:
    """x label and step -> x for the loss plot: tokens seen when every record has it (eval records may borrow
    the count of the train record at the same step), otherwise the step."""
    tokens = {int(r["step"]): _num(r.get("tokens_seen")) for r in train}
    for r in evals:
        t = _num(r.get("tokens_seen"))
        tokens[int(r["step"])] = t if math.isfinite(t) else tokens.get(int(r["step"]), math.nan)
    if tokens and all(math.isfinite(v) for v in tokens.values()):
        return "tokens seen", tokens
    return "training step", {s: float(s) for s in tokens}


def _plot_loss(train: list[dict], evals: list[dict], png: Path, run: str) -> Path:
    label, xmap = _token_axis(train, evals)
    fig = _figure()
    ax = fig.add_subplot()
    if train:
        x = [xmap[int(r["step"])] for r in train]
        y = [_num(r.get("loss")) for r in train]
        few = len(train) <= 30
        ax.plot(x, y, color=BLUE, alpha=0.9 if few else 0.3, lw=1, marker="." if few else None,
                label="train loss" if few else "train loss (raw)")
        if not few:
            ax.plot(x, _ema(y, max(5, len(y) // 50)), color=BLUE, lw=2.2, label="train loss (smoothed)")
    if evals:
        x = [xmap[int(r["step"])] for r in evals]
        y = [_num(r.get("val_loss")) for r in evals]
        last = next((v for v in reversed(y) if math.isfinite(v)), math.nan)
        ax.plot(x, y, color=ORANGE, lw=2, marker="o", ms=6,
                label=f"validation loss (last {last:.3f}, perplexity {math.exp(min(last, 700)):.2f})"
                if math.isfinite(last) else "validation loss")
    else:
        ax.text(0.99, 0.97, "no validation entries in the log", transform=ax.transAxes, ha="right", va="top",
                color=GREY, fontsize=10.5)
    if label == "tokens seen":
        _ticks_si(ax.xaxis)
    else:
        _integer_steps(ax)
    ax.set(title=f"Loss · {run}", xlabel=label, ylabel="cross-entropy loss (nats/token)")
    ax.legend(loc="upper right" if evals else "lower left")
    return _save(fig, png)


def _metric_figure(train: list[dict], key: str):
    """A new figure, its axes, and metric `key` per logged step: (fig, ax, steps, values; NaN where missing)."""
    fig = _figure()
    return fig, fig.add_subplot(), [int(r["step"]) for r in train], [_num(r.get(key)) for r in train]


def _plot_lr(train: list[dict], png: Path, run: str) -> Path:
    fig, ax, steps, lrs = _metric_figure(train, "lr")
    ax.plot(steps, lrs, color=PURPLE, lw=2, marker="." if len(steps) <= 30 else None)
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    peak = max((v for v in lrs if math.isfinite(v)), default=math.nan)
    _integer_steps(ax)
    ax.set(title=f"Learning-rate schedule · {run}", xlabel="optimizer step", ylabel="learning rate")
    if math.isfinite(peak):
        ax.set_ylim(0, peak * 1.08)
        ax.axhline(peak, color=GREY, ls=":", lw=1)
        ax.annotate(f"peak {peak:.3g}", (steps[lrs.index(peak)], peak), xytext=(6, 4), textcoords="offset points",
                    color=GREY, fontsize=10.5)
    return _save(fig, png)


def _plot_speed(train: list[dict], png: Path, run: str) -> Path:
    fig, ax, steps, tps = _metric_figure(train, "tokens_per_s")
    few = len(steps) <= 30
    ax.plot(steps, tps, color=GREEN, alpha=0.9 if few else 0.35, lw=1, marker="." if few else None,
            label="tokens/s" if few else "tokens/s (raw)")
    if not few:
        ax.plot(steps, _ema(tps, max(5, len(tps) // 50)), color=GREEN, lw=2.2, label="tokens/s (smoothed)")
    _ticks_si(ax.yaxis)
    finite = sorted(v for v in tps if math.isfinite(v))
    if finite:
        ax.set_ylim(0, finite[-1] * 1.12)
        ax.axhline(finite[len(finite) // 2], color=GREY, ls=":", lw=1, label=f"median {_si(finite[len(finite) // 2])}/s")
    _integer_steps(ax)
    ax.set(title=f"Training throughput · {run}", xlabel="optimizer step", ylabel="throughput (tokens/s)")
    handles, labels = ax.get_legend_handles_labels()
    mfu = [_num(r.get("mfu")) for r in train]
    if any(math.isfinite(v) for v in mfu):
        # MFU is logged as a fraction (or already in %). It is tokens/s x FLOPs/token / peak, i.e. proportional
        # to throughput: then the right axis is just an MFU scale for the same curve (a second line would
        # hide the first). Only when the ratio varies (another device or peak mid-run) draw MFU separately.
        scale = 100.0 if max(v for v in mfu if math.isfinite(v)) <= 1.5 else 1.0
        ratios = sorted(m * scale / t for m, t in zip(mfu, tps) if math.isfinite(m) and math.isfinite(t) and t > 0)
        ax2 = None
        if ratios and ratios[-1] <= ratios[0] * 1.02:
            k = ratios[len(ratios) // 2]  # % MFU per token/s
            ax2 = ax.secondary_yaxis("right", functions=(lambda x, k=k: x * k, lambda y, k=k: y / k))
        else:
            ax2 = ax.twinx()
            ax2.grid(False)
            pct = [v * scale for v in mfu]
            ax2.plot(steps, pct if few else _ema(pct, max(5, len(pct) // 50)), color=RED, lw=1.6, alpha=0.85,
                     label="MFU (right axis)" if few else "MFU, smoothed (right axis)")
            ax2.set_ylim(0, max(v for v in pct if math.isfinite(v)) * 1.12)
            h2, l2 = ax2.get_legend_handles_labels()
            handles, labels = handles + h2, labels + l2
        ax2.spines["right"].set_visible(True)
        ax2.set_ylabel("model FLOPs utilization (%)", color=RED)
        ax2.tick_params(axis="y", colors=RED)
    ax.legend(handles, labels, loc="lower right")
    return _save(fig, png)


def grad_norm_axis(ax, norms: Sequence[float]) -> None:
    """A log y axis when the norms span a decade or more (spikes), with labels at 1, 2 and 5 of every decade;
    otherwise a linear axis: a log axis over less than a decade had one labelled tick, no readable value."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    finite = [v for v in norms if math.isfinite(v)]
    if finite and min(finite) > 0 and max(finite) / min(finite) >= 10:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())


def _plot_grad_norm(train: list[dict], png: Path, run: str) -> Path:
    fig, ax, steps, norms = _metric_figure(train, "grad_norm")
    ax.plot(steps, norms, color=GREY, lw=1, marker="." if len(steps) <= 30 else None)
    grad_norm_axis(ax, norms)
    _integer_steps(ax)
    ax.set(title=f"Gradient norm (before clipping) · {run}", xlabel="optimizer step", ylabel="global L2 norm")
    return _save(fig, png)


# ------------------------------------------------------------------------------------------ preprocess
_CATEGORY = {"bad": (PURPLE, "unreadable input"), "dedup": (RED, "duplicates"), "filter": (ORANGE, "filtered"),
             "kept": (GREEN, "kept")}


def _count(stats: dict, key: str, path: Path) -> int:
    value = stats.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise CodeParrotError(f"{path}: '{key}' must be a non-negative count, got {value!r}")
    return int(value)


def _reasons(stats: dict, key: str, path: Path) -> dict[str, int]:
    value = stats.get(key) or {}
    if not isinstance(value, dict):
        raise CodeParrotError(f"{path}: '{key}' must be a mapping of reason to count, got {type(value).__name__}")
    return {str(k): _count(value, k, path) for k in value}


def filter_stats_subtitle(stats: dict) -> str:
    """"12.3 MB in → 8.1 MB out · 2.2 s wall-clock" from a preprocess stats.json (what it holds of them)."""
    sub = []
    if isinstance(stats.get("bytes_in"), (int, float)) and isinstance(stats.get("bytes_out"), (int, float)):
        sub.append(f"{stats['bytes_in'] / 1e6:,.1f} MB in → {stats['bytes_out'] / 1e6:,.1f} MB out")
    # the run's wall clock: the other entries are per stage (CPU time summed over workers) and per pass (which
    # hold those stages), so their sum counted each stage two or three times
    wall = stats["seconds"].get("total") if isinstance(stats.get("seconds"), dict) else None
    if isinstance(wall, (int, float)) and not isinstance(wall, bool):
        sub.append(f"{wall:,.1f} s wall-clock")
    return " · ".join(sub)


def plot_filter_stats(stats_json: str | os.PathLike, png: str | os.PathLike) -> Path:
    """Horizontal bars: how many files each bad-input reason, dedup stage and filter removed, and how many
    were kept for train and valid, with counts and shares of the input on the bars."""
    from matplotlib import rc_context
    from matplotlib.patches import Patch

    path = Path(stats_json)
    try:
        stats = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise CodeParrotError(f"{path}: {err.strerror or err}") from None
    except ValueError as err:
        raise CodeParrotError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(stats, dict):
        raise CodeParrotError(f"{path}: expected a JSON object of preprocessing statistics")
    total = _count(stats, "input_records", path)
    rows: list[tuple[str, int, str]] = []
    for reason, n in sorted(_reasons(stats, "bad_records", path).items(), key=lambda kv: -kv[1]):
        rows.append((f"bad record: {reason}", n, "bad"))
    rows.append(("exact duplicate", _count(stats, "exact_duplicates", path), "dedup"))
    if "near_duplicates" in stats:
        rows.append(("near duplicate", _count(stats, "near_duplicates", path), "dedup"))
    for reason, n in sorted(_reasons(stats, "filtered", path).items(), key=lambda kv: -kv[1]):
        rows.append((f"filter: {reason.replace('_', ' ')}", n, "filter"))
    kept = [("kept: train", _count(stats, "kept_train", path), "kept"),
            ("kept: valid", _count(stats, "kept_valid", path), "kept")]
    rows += kept
    n_kept = sum(n for _, n, _ in kept)
    with rc_context(STYLE):
        fig = _figure(10.0, max(3.2, 1.4 + 0.42 * len(rows)))
        ax = fig.add_subplot()
        ys = list(range(len(rows)))[::-1]  # first row at the top
        counts = [n for _, n, _ in rows]
        ax.barh(ys, counts, color=[_CATEGORY[c][0] for *_, c in rows], height=0.7)
        ax.set_yticks(ys, [label for label, *_ in rows])
        top = max(counts + [1])
        for y, n in zip(ys, counts):
            share = f" ({100 * n / total:.1f}%)" if total else ""
            ax.text(n + top * 0.01, y, f"{n:,}{share}", va="center", fontsize=10.5)
        ax.set_xlim(0, top * 1.25)  # room for the labels
        _ticks_si(ax.xaxis)
        ax.grid(axis="y", visible=False)
        ax.set_xlabel("files")
        pct = f" ({100 * n_kept / total:.1f}%)" if total else ""
        fig.suptitle(f"Preprocessing: {total:,} files in → {n_kept:,} kept{pct}", fontsize=15, fontweight="bold")
        subtitle = filter_stats_subtitle(stats)
        if subtitle:
            ax.set_title(subtitle, fontsize=11, fontweight="normal", color=GREY)
        used = [c for c in _CATEGORY if any(r[2] == c for r in rows)]
        fig.legend([Patch(color=_CATEGORY[c][0]) for c in used], [_CATEGORY[c][1] for c in used],
                   loc="outside lower center", ncols=len(used), frameon=False)
        return _save(fig, png)


# ----------------------------------------------------------------------------------------- checkpoints
def plot_checkpoint_losses(points: Iterable[tuple[int, float]], png: str | os.PathLike, title: str,
                           measured_on: str = "") -> Path:
    """Validation loss of each checkpoint (step, loss) with the best one marked; perplexity on the right.
    `measured_on` (sequences x length the losses were computed on) goes under the title."""
    from matplotlib import rc_context

    pts = sorted((int(s), float(v)) for s, v in points if v is not None and math.isfinite(float(v)))
    if not pts:
        raise CodeParrotError(f"no checkpoints with a finite validation loss to plot for {title!r}")
    steps, losses = [s for s, _ in pts], [v for _, v in pts]
    best = min(range(len(pts)), key=lambda i: (losses[i], steps[i]))
    with rc_context(STYLE):
        fig = _figure()
        ax = fig.add_subplot()
        ax.plot(steps, losses, color=ORANGE, lw=2, marker="o", ms=6, label="validation loss")
        ax.plot([steps[best]], [losses[best]], marker="*", ms=18, color=RED, ls="none",
                label=f"best: step {steps[best]:,}, loss {losses[best]:.3f}")
        ax.annotate(f"{losses[best]:.3f}", (steps[best], losses[best]), xytext=(0, -18), textcoords="offset points",
                    ha="center", color=RED, fontsize=11)
        lo, hi = min(losses), max(losses)
        pad = (hi - lo) * 0.15 or max(abs(hi) * 0.05, 0.05)
        ax.set_ylim(lo - pad, hi + pad)
        if len(steps) == 1:
            ax.set_xlim(steps[0] - 2, steps[0] + 2)
        sec = ax.secondary_yaxis("right", functions=(_exp, _log))
        sec.set_ylabel("perplexity")
        _integer_steps(ax)
        ax.set(title=title + (f"\n{measured_on}" if measured_on else ""), xlabel="training step",
               ylabel="validation loss (nats/token)")
        ax.legend(loc="upper right")
        return _save(fig, png)


def _exp(x):

    return np.exp(np.clip(x, -50, 50))


def _log(x):

    return np.log(np.clip(x, 1e-300, None))


@dataclass
class LossPoint:
    """One validation loss of one checkpoint of one branch (an experiment)."""

    branch: str
    step: int
    tokens_seen: int | None  # None when the source does not say
    loss: float
    commit: str = ""  # the checkpoint, when known


def plot_losses(points: Sequence[LossPoint], png: str | os.PathLike, title: str, measured_on: str = "") -> Path:
    """One line per branch: validation loss against tokens seen (against step when any point lacks the count).
    `measured_on` (what the losses were computed on: sequences x length) is printed under the title; losses
    measured on different data are not comparable."""
    from matplotlib import rc_context

    points = [p for p in points if p.loss is not None and math.isfinite(p.loss)]
    if not points:
        raise CodeParrotError("no validation losses to plot")
    by_tokens = all(p.tokens_seen is not None for p in points)
    colours = [BLUE, ORANGE, GREEN, RED, PURPLE]
    with rc_context(STYLE):
        fig = _figure(9, 4.8)
        ax = fig.add_subplot()
        branches = list(dict.fromkeys(p.branch for p in points))
        for i, branch in enumerate(branches):
            pts = sorted((p for p in points if p.branch == branch), key=lambda p: p.step)
            xs = [p.tokens_seen if by_tokens else p.step for p in pts]
            best = min(pts, key=lambda p: (p.loss, p.step))
            ax.plot(xs, [p.loss for p in pts], marker="o", lw=2, color=colours[i % len(colours)],
                    label=f"{branch} (best {best.loss:.3f} at step {best.step:,})")
        if by_tokens:
            _ticks_si(ax.xaxis)
        else:
            _integer_steps(ax)
        ax.set(title=title + (f"\n{measured_on}" if measured_on else ""),
               xlabel="tokens seen" if by_tokens else "training step", ylabel="validation loss (nats/token)")
        ax.legend(loc="upper right")
        return _save(fig, png)

