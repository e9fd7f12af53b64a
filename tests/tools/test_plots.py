"""codeparrot.tools.plots: real PNGs from realistic logs, including the awkward ones (no eval, resumed, cut off)."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest

from codeparrot.errors import CodeParrotError
from codeparrot.tools.plots import (
    filter_stats_subtitle,
    plot_checkpoint_losses,
    plot_filter_stats,
    plot_training,
    read_metrics,
)

GREEN, PURPLE = (0x2C, 0xA0, 0x2C), (0x94, 0x67, 0xBD)


def _png_size(path: Path) -> tuple[int, int]:
    """Width and height from the PNG header, after checking the signature."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def _assert_sensible_png(path: Path) -> None:
    w, h = _png_size(path)
    assert 700 <= w <= 2000 and 350 <= h <= 2000, (path.name, w, h)
    assert path.stat().st_size > 15_000, f"{path.name} looks empty ({path.stat().st_size} bytes)"


def _has_colour(path: Path, rgb: tuple[int, int, int], min_pixels: int = 200) -> bool:
    from matplotlib.image import imread

    img = (imread(path)[..., :3] * 255).round()
    close = (abs(img[..., 0] - rgb[0]) <= 2) & (abs(img[..., 1] - rgb[1]) <= 2) & (abs(img[..., 2] - rgb[2]) <= 2)
    return int(close.sum()) >= min_pixels


def _write_metrics(path: Path, steps: int = 300, eval_every: int | None = 50, fields: tuple = ("lr", "grad_norm",
                   "tokens_per_s", "mfu")) -> None:
    lines = []
    for step in range(1, steps + 1):
        rec = {"step": step, "tokens_seen": step * 2048, "loss": 7 * math.exp(-step / 60) + 2 + 0.1 * math.sin(step)}
        extra = {"lr": 5e-4 * min(1, step / 30), "grad_norm": 1 + 0.2 * math.cos(step),
                 "tokens_per_s": 2400 + 50 * math.sin(step / 5), "mfu": 0.48}
        rec.update({k: v for k, v in extra.items() if k in fields})
        lines.append(json.dumps(rec))
        if eval_every and step % eval_every == 0:
            lines.append(json.dumps({"step": step, "tokens_seen": step * 2048, "val_loss": 7 * math.exp(-step / 60) + 2.2,
                                     "perplexity": math.exp(7 * math.exp(-step / 60) + 2.2)}))
    path.write_text("\n".join(lines) + "\n")


def test_training_plots_from_a_full_log(tmp_path):
    metrics = tmp_path / "run-a" / "metrics.jsonl"
    metrics.parent.mkdir()
    _write_metrics(metrics)
    pngs = plot_training(metrics, tmp_path / "plots")
    assert [p.name for p in pngs] == ["loss.png", "learning_rate.png", "throughput.png", "grad_norm.png"]
    for p in pngs:
        _assert_sensible_png(p)
    assert not list((tmp_path / "plots").glob(".*tmp*")), "temporary files left behind"


def test_training_plots_without_eval_or_optional_fields(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    _write_metrics(metrics, steps=12, eval_every=None, fields=())
    pngs = plot_training(metrics, tmp_path / "plots")
    assert [p.name for p in pngs] == ["loss.png"]  # nothing to draw for lr/throughput/grad-norm
    _assert_sensible_png(pngs[0])
    # eval entries without token counts borrow them from the train record of the same step
    with metrics.open("a") as f:
        f.write(json.dumps({"step": 12, "val_loss": 3.5}) + "\n")
    train, evals = read_metrics(metrics)
    assert len(train) == 12 and [e["step"] for e in evals] == [12]
    _assert_sensible_png(plot_training(metrics, tmp_path / "plots2")[0])


def test_resumed_and_cut_off_logs(tmp_path, capsys):
    metrics = tmp_path / "metrics.jsonl"
    _write_metrics(metrics, steps=100)
    with metrics.open("a") as f:  # a resume re-logs steps 91..100 with other values, then the kill cuts a line
        for step in range(91, 101):
            f.write(json.dumps({"step": step, "tokens_seen": step * 2048, "loss": 1.0}) + "\n")
        f.write('{"step": 101, "loss": 2.')
    train, _ = read_metrics(metrics)
    pngs = plot_training(metrics, tmp_path / "plots")
    assert f"warning: {metrics}: skipped 1 unreadable line(s), first at line 113\n" in capsys.readouterr().err
    assert [r["step"] for r in train] == list(range(1, 101))  # one record per step, sorted
    assert all(r["loss"] == 1.0 for r in train[90:])  # the later (resumed) values win
    assert len(pngs) == 4


def test_empty_or_missing_log_is_an_error(tmp_path):
    empty = tmp_path / "metrics.jsonl"
    empty.write_text("")
    with pytest.raises(CodeParrotError, match="no training"):
        plot_training(empty, tmp_path)
    with pytest.raises(CodeParrotError, match="nope.jsonl"):
        plot_training(tmp_path / "nope.jsonl", tmp_path)


def _stats(**over):
    stats = {"input_records": 1812, "bad_records": {"malformed JSON": 3, "invalid UTF-8": 1},
             "exact_duplicates": 41, "near_duplicates": 87,
             "filtered": {"config_or_test": 120, "few_assignments": 64, "max_line_length": 12, "auto_generated": 5},
             "kept_train": 1422, "kept_valid": 16, "bytes_in": 24_500_000, "bytes_out": 19_800_000,
             "seconds": {"read": 1.2, "exact_dedup": 0.8, "near_dedup": 3.1, "write": 0.7}}
    stats.update(over)
    return stats


def test_the_filter_chart_subtitle_gives_the_runs_wall_clock_not_a_sum_of_nested_stages():
    """stats.json's `seconds` holds per-stage CPU times and the passes that contain them: their sum (6.3 s for a
    2.2 s demo run) was shown as the total."""
    seconds = {"read": 0.33, "filters": 0.75, "write": 0.54, "pass1": 2.24, "pass2": 0.77, "total": 3.26}
    assert filter_stats_subtitle(_stats(seconds=seconds)) == "24.5 MB in → 19.8 MB out · 3.3 s wall-clock"
    assert filter_stats_subtitle(_stats(seconds={"read": 1.2})) == "24.5 MB in → 19.8 MB out"  # no wall clock


def test_filter_stats_chart(tmp_path):
    path = tmp_path / "stats.json"
    path.write_text(json.dumps(_stats()))
    png = plot_filter_stats(path, tmp_path / "filters.png")
    _assert_sensible_png(png)
    assert _has_colour(png, GREEN) and _has_colour(png, PURPLE)  # kept bars and bad-record bars are drawn
    # no bad records and no near-dedup run: no purple bars, still a chart
    minimal = {k: v for k, v in _stats(bad_records={}).items() if k != "near_duplicates"}
    path.write_text(json.dumps(minimal))
    png2 = plot_filter_stats(path, tmp_path / "filters2.png")
    _assert_sensible_png(png2)
    assert not _has_colour(png2, PURPLE, min_pixels=50)
    assert _png_size(png)[1] > _png_size(png2)[1]  # one bar per reason: the chart grows with the rows


def test_filter_stats_bad_input(tmp_path):
    path = tmp_path / "stats.json"
    path.write_text(json.dumps(_stats(filtered={"max_line_length": "many"})))
    with pytest.raises(CodeParrotError, match="max_line_length"):
        plot_filter_stats(path, tmp_path / "x.png")
    path.write_text("{not json")
    with pytest.raises(CodeParrotError, match="not valid JSON"):
        plot_filter_stats(path, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_checkpoint_losses(tmp_path):
    png = plot_checkpoint_losses([(3000, 2.55), (1000, 3.2), (2000, 2.7), (4000, 2.6), (500, 4.1)],
                                 tmp_path / "ckpt.png", "demo-tiny: validation loss per checkpoint")
    _assert_sensible_png(png)
    _assert_sensible_png(plot_checkpoint_losses([(100, 5.0)], tmp_path / "one.png", "one checkpoint"))
    with pytest.raises(CodeParrotError, match="no checkpoints"):
        plot_checkpoint_losses([], tmp_path / "none.png", "nothing")
    with pytest.raises(CodeParrotError, match="no checkpoints"):
        plot_checkpoint_losses([(1, float("nan"))], tmp_path / "none.png", "nothing")


def _visible_tick_labels(norms: list[float]) -> list[str]:
    """The y tick labels a reader sees on a drawn grad-norm axis (inside the view, non-empty)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from codeparrot.tools.plots import grad_norm_axis

    fig = Figure()
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot(range(len(norms)), norms)
    grad_norm_axis(ax, norms)
    fig.canvas.draw()
    lo, hi = ax.get_ylim()
    ticks = list(ax.yaxis.get_major_ticks()) + list(ax.yaxis.get_minor_ticks())
    return [t.label1.get_text() for t in ticks
            if t.label1.get_visible() and t.label1.get_text() and lo <= t.get_loc() <= hi]


@pytest.mark.parametrize("norms", [
    [0.3 + 0.05 * math.sin(i) for i in range(50)],  # less than a decade: the case that had one label
    [1.0 + 0.2 * math.cos(i) for i in range(50)],
    [0.5] * 20 + [40.0] + [0.6] * 20,  # a spike: log scale
])
def test_grad_norm_axis_has_readable_values(norms):
    labels = _visible_tick_labels(norms)
    assert len(labels) >= 3, labels
    assert all(float(label.replace("\u2212", "-")) > 0 for label in labels), labels


def test_plot_losses_several_branches_with_what_they_were_measured_on(tmp_path):
    from codeparrot.tools.plots import LossPoint, plot_losses

    points = [LossPoint("a", s, s * 100, 6 - s / 10) for s in (10, 20, 30)] + [LossPoint("b", 10, 1000, 5.5)]
    _assert_sensible_png(plot_losses(points, tmp_path / "l.png", "validation loss", "10 sequences x 64 tokens"))
    with pytest.raises(CodeParrotError, match="no validation losses"):
        plot_losses([LossPoint("a", 1, None, float("nan"))], tmp_path / "none.png", "t")


def test_rerun_summary_shows_reused_stage_times_not_zero():
    from codeparrot.tools.demo_summary import stage_time_line

    fresh = stage_time_line({"export": 1.2, "train": 264.0, "total": 270.0}, [])
    assert fresh == "stage wall time (s): export 1, train 264, total 270"
    rerun = stage_time_line({"export": 1.2, "train": 264.0, "total": 0.4}, ["export", "train"])
    assert "train 264 (reused)" in rerun and "this run 0 (2 of 2 stages reused)" in rerun
    assert "all stages when they ran 265" in rerun and "total 0" not in rerun
