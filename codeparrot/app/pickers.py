"""The branch + checkpoint picker the Complete, Highlight and Experiments tabs share, and its choice lists."""

from __future__ import annotations

from codeparrot.app.workspace import LATEST, Workspace, logger


def branch_names(ws: Workspace) -> list[str]:
    """Branch names, `main` first; [] when the repository cannot be read (the page says why elsewhere)."""
    try:
        return [b.name for b in ws.repository().list_branches()]
    except Exception as err:  # noqa: BLE001 - a picker without choices still works with typed names
        logger.info("cannot list branches of %s: %s", ws.ref, err)
        return []


def checkpoint_choices(ws: Workspace, branch: str | None) -> list[tuple[str, str]]:
    """("label", commit id) per commit on `branch`, newest first, after ("latest", "latest")."""
    choices = [(f"{LATEST} (newest commit)", LATEST)]
    try:
        for c in ws.repository().list_commits((branch or "").strip() or "main"):
            step = f"step {c.step}" if c.step is not None else c.message[:40]
            choices.append((f"{c.commit_id[:12]} · {step} · {c.date[:16]}", c.commit_id))
    except Exception as err:  # noqa: BLE001 - an unknown branch is reported when the model is used
        logger.info("cannot list commits of %s: %s", branch, err)
    return choices


def revision_picker(ws: Workspace, prefix: str = ""):
    """A branch dropdown and a checkpoint dropdown that follows it. Both accept typed values (a branch, a tag or
    a commit id), so a bad revision reaches the handler and gets its one-line message."""
    import gradio as gr

    branches = branch_names(ws)
    start = ws.revision if ws.revision else ("main" if "main" in branches or not branches else branches[0])
    with gr.Row():
        branch = gr.Dropdown(branches or [start], value=start, label=f"{prefix}branch (experiment)",
                             allow_custom_value=True, interactive=True)
        checkpoint = gr.Dropdown(checkpoint_choices(ws, start), value=LATEST, label=f"{prefix}checkpoint",
                                 allow_custom_value=True, interactive=True)
    branch.change(lambda b: gr.Dropdown(choices=checkpoint_choices(ws, b), value=LATEST), branch, checkpoint,
                  api_visibility="private")
    return branch, checkpoint
