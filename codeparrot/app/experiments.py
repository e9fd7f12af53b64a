"""The Experiments tab (API `/experiments` and friends): branches, checkpoints, loss curves, side by side, promote.

Endpoints: `/experiments` (branches, `main` first, with latest step and date), `/checkpoints` (a branch's
commits), `/losses` (validation loss vs tokens seen for several branches on one plot; streamed, so that a client
who cancels or leaves stops its evaluation), `/compare` (one prompt completed by two checkpoints) and `/promote`
(a checkpoint becomes `main`; refused unless confirmed).
"""

from __future__ import annotations

import time
from contextlib import closing
from typing import Callable

from codeparrot.app.access import MAX_EVAL_STEPS
from codeparrot.app.background import HEARTBEAT, in_background
from codeparrot.app.complete import EXAMPLE_PROMPT, fit_to_context, new_tokens, stream_generation
from codeparrot.app.losses import computed_losses, logged_losses
from codeparrot.app.pickers import branch_names, revision_picker
from codeparrot.app.whole_number import whole_number
from codeparrot.app.workspace import CHARTS, Workspace, guarded
from codeparrot.errors import CodeParrotError
from codeparrot.inference.completion import generate_completions
from codeparrot.tools.plots import plot_losses

BRANCH_HEADERS = ["branch", "latest step", "date", "commit"]
CHECKPOINT_HEADERS = ["commit", "step", "date", "message"]


def experiments_table(ws: Workspace) -> tuple[list[list], str]:
    branches = ws.repository().list_branches()
    rows = [[b.name, "" if b.latest_step is None else b.latest_step, b.date, b.commit_id[:12]] for b in branches]
    return rows, f"{ws.ref}: {len(rows)} branch(es)"


def checkpoints_table(ws: Workspace, branch: str) -> tuple[list[list], str]:
    branch = (branch or "").strip() or "main"
    commits = ws.repository().list_commits(branch)
    rows = [[c.commit_id[:12], "" if c.step is None else c.step, c.date, c.message] for c in commits]
    return rows, f"{branch}: {len(rows)} checkpoint(s), newest first"


def losses_plot(ws: Workspace, branches: list[str] | str | None, dataset: str | None, max_eval_steps: float,
                progress, should_stop: Callable[[], bool] | None = None) -> tuple[str, str]:
    """(PNG path, status): logged metrics per branch, or computed on `dataset` when one is given (`should_stop`:
    see `computed_losses`)."""
    if isinstance(branches, str):
        branches = [branches]
    branches = [b for b in (branches or []) if b and b.strip()]
    if not branches:
        raise CodeParrotError("choose at least one branch to plot")
    points, missing, measured = [], [], []
    for branch in branches:
        if dataset and dataset.strip():
            branch_points, measured_on = computed_losses(ws, branch, dataset.strip(), max_eval_steps,
                                                         lambda f, what: progress(f, desc=what), should_stop)
        else:
            try:
                branch_points, measured_on = logged_losses(ws, branch)
            except CodeParrotError as err:  # e.g. main, which no run logged: plot the others, say which are missing
                if len(branches) == 1:
                    raise
                missing.append(f"{branch} ({err})")
                continue
        points += branch_points
        measured.append(f"{branch}: {measured_on}" if len(branches) > 1 else measured_on)
    if not points:
        raise CodeParrotError(f"no validation losses found for {', '.join(branches)}: " + "; ".join(missing))
    png = CHARTS.new("losses.png")
    source = f"on {dataset.strip()}" if dataset and dataset.strip() else "as pushed/logged by the runs"
    measured_on = "; ".join(m for m in measured if m)
    plot_losses(points, png, f"validation loss {source}", measured_on=measured_on)
    skipped = f" · not plotted: {'; '.join(missing)}" if missing else ""
    source += f", measured on {measured_on}" if measured_on else ""
    return str(png), f"{len(points)} point(s) ({source}){skipped}"


def stream_losses(ws: Workspace, branches: list[str] | str | None, dataset: str | None, max_eval_steps: float,
                  progress=None):
    """`losses_plot` for a request that streams: yields (None, what it is doing) until the plot is ready, then
    (PNG path, status). Computing the losses can take long (up to MAX_EVAL_STEPS batches per checkpoint of
    every branch): it runs on a thread (`in_background`) that a client who cancels or leaves stops before its
    next batch, and this generator yields at every report and heartbeat (`in_background`) so that Gradio can
    close it at all; a heartbeat shows the last thing reported with the time so far."""
    start = time.perf_counter()
    what = "plotting"  # what the status line says until the first report

    def work(stop, report) -> tuple[str, str]:
        report((0.0, "plotting"))  # at once: the progress bar shows that it started
        return losses_plot(ws, branches, dataset, max_eval_steps, lambda f, desc="": report((f, desc)),
                           should_stop=stop.is_set)

    with closing(in_background(work, "codeparrot-losses")) as stream:
        for update, plotted in stream:
            if plotted is None:
                if update is not HEARTBEAT:
                    fraction, what = update
                    if progress is not None:
                        progress(fraction, desc=what)
                yield None, f"{what} … {time.perf_counter() - start:.0f} s"
    yield plotted


def compare(ws: Workspace, prompt: str, branch_a: str, ckpt_a: str, branch_b: str, ckpt_b: str,
            temperature: float, max_new_tokens: float, seed: float):
    """The same prompt completed by two checkpoints with the same sampling settings and seed: yields (A, B,
    status) as A, then B, streams. Streamed like the Complete tab so that a client that cancels or leaves stops
    the generation (`stream_generation`) instead of holding the generation lock through two of them."""
    if prompt is None or not prompt.strip():
        raise CodeParrotError("the prompt is empty; type the start of a function to complete")
    ws.check_text(prompt, "prompt")
    max_new_tokens = new_tokens(max_new_tokens)
    seed = whole_number(seed, "the seed", why=" (both checkpoints sample with it)")
    outs, labels = ["", ""], []
    for side, (branch, ckpt) in enumerate(((branch_a, ckpt_a), (branch_b, ckpt_b))):
        model, tokenizer, label = ws.model(branch, ckpt)
        fitted = fit_to_context(model, tokenizer, prompt, max_new_tokens)
        outs[side] = prompt
        with closing(stream_generation(  # closed with this generator: a cancelled request stops the generation
                tokenizer, lambda streamer: generate_completions(
                    model, tokenizer, prompt, max_new_tokens=fitted, temperature=float(temperature), seed=seed,
                    streamer=streamer), name="codeparrot-compare")) as stream:
            for piece, completions in stream:
                if completions is None:
                    outs[side] += "" if piece is HEARTBEAT else piece  # a heartbeat: yield the same (closable)
                    yield outs[0], outs[1], f"generating with {label} …"
        done = completions[0]
        outs[side] = prompt + done.text
        labels.append(f"{label}: {done.num_tokens} tokens, ended by {done.stop_reason}")
    yield outs[0], outs[1], " · ".join(labels)


def promote(ws: Workspace, branch: str, checkpoint: str, confirmed: bool) -> tuple[str, list[list]]:
    """Promote the chosen checkpoint to `main` (only when `confirmed`); (status, refreshed branch rows)."""
    if not confirmed:
        raise CodeParrotError("not promoted: tick the confirmation box first (main will point to this checkpoint)")
    branch, commit = ws.resolve(branch, checkpoint)
    repo = ws.repository()
    before = repo.list_commits("main")[:1]
    new = repo.promote(commit)
    rows, _ = experiments_table(ws)
    held = f"{before[0].commit_id[:12]} ({before[0].message})" if before else "nothing"
    return (f"promoted {branch}@{commit[:12]} to main of {ws.ref}: new main commit {new[:12]}; main held {held} "
            f"before"), rows


def build_experiments_tab(ws: Workspace) -> list[tuple]:
    """The tab's components and events; returns the (fn, inputs, outputs) to run when a page loads."""
    import gradio as gr

    gr.Markdown("Every branch is an experiment, every commit a checkpoint. `main` holds the promoted model.")
    refresh = gr.Button("Refresh", elem_id="experiments-refresh", size="sm")
    status = gr.Markdown(elem_id="experiments-status")
    branches = gr.Dataframe(headers=BRANCH_HEADERS, label="branches", interactive=False, elem_id="experiments-branches")
    with gr.Accordion("Checkpoints of a branch", open=True):
        names = branch_names(ws)
        chosen = gr.Dropdown(names, value=names[0] if names else None, label="branch", allow_custom_value=True,
                             elem_id="checkpoints-branch")
        checkpoints = gr.Dataframe(headers=CHECKPOINT_HEADERS, label="checkpoints (newest first)",
                                   interactive=False, elem_id="experiments-checkpoints")
    with gr.Accordion("Validation loss against tokens seen", open=True):
        with gr.Row():
            plotted = gr.Dropdown(names, value=names[:2], multiselect=True, allow_custom_value=True,
                                  label="branches", elem_id="losses-branches")
            dataset = gr.Textbox(label="validation folder inside the app's --data-dir (empty: the losses the runs "
                                       "logged)", placeholder="e.g. valid", elem_id="losses-dataset")
            steps = gr.Number(4, precision=0,  # bounded by the handler: its refusal is the tab's status line
                              label=f"batches per checkpoint (on demand, at most {MAX_EVAL_STEPS})",
                              elem_id="losses-steps")
        plot_button = gr.Button("Plot", elem_id="losses-button")
        plot = gr.Image(type="filepath", label="validation loss", elem_id="losses-plot", interactive=False)
    with gr.Accordion("Two checkpoints, one prompt", open=True):
        prompt = gr.Code(EXAMPLE_PROMPT, language="python", label="prompt", lines=4, elem_id="compare-prompt")
        with gr.Row():
            with gr.Column():
                branch_a, ckpt_a = revision_picker(ws, "A: ")
            with gr.Column():
                branch_b, ckpt_b = revision_picker(ws, "B: ")
        with gr.Row():
            temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="temperature (0 = greedy)")
            max_new = gr.Slider(1, 512, value=64, step=1, label="max new tokens")
            seed = gr.Number(0, precision=0, label="seed")
        compare_button = gr.Button("Complete with both", elem_id="compare-button")
        with gr.Row():
            out_a = gr.Textbox(label="A", lines=8, interactive=False, elem_id="compare-a", elem_classes=["cp-code"])
            out_b = gr.Textbox(label="B", lines=8, interactive=False, elem_id="compare-b", elem_classes=["cp-code"])
    with gr.Accordion("Promote a checkpoint to main", open=True):
        gr.Markdown("Promoting adds a commit on `main` with exactly the files of the chosen checkpoint "
                    "(nothing is deleted; the previous `main` stays in its history).")
        branch_p, ckpt_p = revision_picker(ws, "promote: ")
        confirm = gr.Checkbox(False, label="I confirm: main will point to this checkpoint", elem_id="promote-confirm")
        promote_button = gr.Button("Promote to main", variant="stop", elem_id="promote-button")

    def loaded(*outs):
        return lambda line: (*outs, line)

    @guarded(loaded([]))
    def experiments():
        return experiments_table(ws)

    @guarded(loaded([]))
    def list_checkpoints(branch):
        return checkpoints_table(ws, branch)

    @guarded(loaded(None))
    def losses(branches, dataset, steps, progress=gr.Progress()):
        yield from stream_losses(ws, branches, dataset, steps, progress)  # streamed: see stream_losses

    @guarded(loaded("", ""))
    def compare_both(prompt, branch_a, ckpt_a, branch_b, ckpt_b, temperature, max_new, seed):
        yield from compare(ws, prompt, branch_a, ckpt_a, branch_b, ckpt_b, temperature, max_new, seed)

    @guarded(lambda line: (line, gr.skip()))
    def promote_checkpoint(branch, checkpoint, confirmed):
        return promote(ws, branch, checkpoint, confirmed)

    refresh.click(experiments, None, [branches, status], api_name="experiments")
    chosen.change(list_checkpoints, chosen, [checkpoints, status], api_name="checkpoints")
    plot_button.click(losses, [plotted, dataset, steps], [plot, status], api_name="losses")
    compare_button.click(compare_both, [prompt, branch_a, ckpt_a, branch_b, ckpt_b, temperature, max_new, seed],
                         [out_a, out_b, status], api_name="compare")
    promote_button.click(promote_checkpoint, [branch_p, ckpt_p, confirm], [status, branches], api_name="promote")
    return [(experiments, None, [branches, status]), (list_checkpoints, chosen, [checkpoints, status])]


