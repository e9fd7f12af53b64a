"""The Data tab (API `/data`): what preprocessing removed and why, from a preprocess output's `stats.json`.

Counts per bad-record reason and per filter, exact and near duplicates with their clusters, what was kept, drawn
by `codeparrot.tools.plots.plot_filter_stats` (the same chart as `scripts/plot.py filters`) and listed as a table.
"""

from __future__ import annotations

import json

from codeparrot.app.workspace import CHARTS, Workspace, guarded
from codeparrot.errors import CodeParrotError
from codeparrot.tools.plots import plot_filter_stats

HEADERS = ["what", "files", "share of input"]


def data_summary(ws: Workspace) -> tuple[str | None, list[list], str]:
    """(chart PNG, rows, status) for `ws.data_dir`, or a one-line error when it is missing or unreadable."""
    if ws.data_dir is None:
        raise CodeParrotError("no preprocess output given: start the app with --data-dir PATH (a folder holding "
                              "stats.json, e.g. demo_output/clean)")
    stats_path = ws.data_dir / "stats.json"
    if not stats_path.is_file():
        raise CodeParrotError(f"{stats_path} not found: --data-dir must be a preprocess output folder")
    png = plot_filter_stats(stats_path, CHARTS.new("filters.png"))
    stats = json.loads(stats_path.read_text(encoding="utf-8"))
    total = stats.get("input_records") or 0

    def row(what: str, n) -> list:
        return [what, int(n or 0), f"{100 * (n or 0) / total:.1f}%" if total else ""]

    rows = [row("input files", total)]
    rows += [row(f"bad record: {r}", n) for r, n in sorted((stats.get("bad_records") or {}).items())]
    rows.append(row("exact duplicates", stats.get("exact_duplicates")))
    rows.append(row("near duplicates (removed)", stats.get("near_duplicates")))
    rows.append(row(f"files in {stats.get('near_duplicate_clusters', 0):,} near-duplicate clusters",
                    stats.get("files_in_clusters")))
    rows += [row(f"filter: {r.replace('_', ' ')}", n) for r, n in (stats.get("filtered") or {}).items()]
    rows.append(row("decontaminated (HumanEval overlap)", stats.get("decontaminated")))
    rows += [row("kept: train", stats.get("kept_train")), row("kept: valid", stats.get("kept_valid"))]
    return str(png), rows, f"{stats_path}: {total:,} files in, {int(stats.get('kept_train', 0)) + int(stats.get('kept_valid', 0)):,} kept"


def build_data_tab(ws: Workspace) -> list[tuple]:
    """The tab's components and events; returns the (fn, inputs, outputs) to run when a page loads."""
    import gradio as gr

    gr.Markdown("What preprocessing removed and why (`stats.json` of the folder given with `--data-dir`).")
    status = gr.Markdown(elem_id="data-status")
    chart = gr.Image(type="filepath", label="files removed per reason", interactive=False, elem_id="data-chart")
    table = gr.Dataframe(headers=HEADERS, label="counts", interactive=False, elem_id="data-table")
    refresh = gr.Button("Reload stats.json", size="sm", elem_id="data-refresh")

    @guarded(lambda line: (None, [], line))
    def data():
        return data_summary(ws)

    refresh.click(data, None, [chart, table, status], api_name="data")
    return [(data, None, [chart, table, status])]
