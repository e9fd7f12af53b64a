"""scripts/plot.py's subcommands: one dataclass each (its flags) and the plot it draws (returns the PNGs)."""

from __future__ import annotations

from dataclasses import dataclass

from codeparrot.config import REQUIRED, doc
from codeparrot.tools.plots import plot_filter_stats, plot_training


@dataclass
class TrainingPlotsConfig:
    """train/validation loss vs tokens seen, learning rate, tokens/s"""

    metrics: str = doc(REQUIRED, "metrics.jsonl written by scripts/train.py in its run folder", flag="metrics")
    output_dir: str = doc(REQUIRED, "folder the PNGs are written to")


@dataclass
class FilterPlotConfig:
    """files removed by each filter and dedup stage, and files kept"""

    stats: str = doc(REQUIRED, "stats.json written by scripts/preprocess.py", flag="stats")
    output: str = doc(REQUIRED, "PNG to write")


# scripts/plot.py's subcommands: name -> (config, what it draws; returns the PNGs written).
PLOT_COMMANDS = {
    "training": (TrainingPlotsConfig, lambda cfg: plot_training(cfg.metrics, cfg.output_dir)),
    "filters": (FilterPlotConfig, lambda cfg: [plot_filter_stats(cfg.stats, cfg.output)]),
}
