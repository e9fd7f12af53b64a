"""Who may use the app and what a request may read: the app's own data folder only, logins through Gradio.

Threat model (docs/app.md, "The web app"): whoever reaches the port can do everything the page can (load any
checkpoint of the repository, run validation on the server's CPU/GPU, promote a checkpoint to `main`). So the
app listens on loopback by default; a non-loopback `--host` needs `--auth USER:PASS` or `--auth-file FILE` (Gradio's
own login: every page, API call and queue request then needs the session cookie), or an explicit
`--allow-unauthenticated` (e.g. behind a proxy that authenticates). A request can name a folder on the server
(the Experiments tab's validation folder): only folders under `--data-dir` are accepted, resolved with every
symlink followed, and a refusal says nothing about the path beyond that it is not inside (not whether it exists,
nothing of what it holds). The number of batches evaluated per checkpoint is bounded.
"""

from __future__ import annotations

import os
from pathlib import Path

from codeparrot.app.whole_number import whole_number
from codeparrot.errors import CodeParrotError
from codeparrot.loopback import is_loopback

MAX_EVAL_STEPS = 256  # batches per checkpoint one request may ask for (each costs a forward pass per checkpoint)


def parse_credentials(auth: str | None, auth_file: str | None) -> list[tuple[str, str]] | None:
    """[(user, password)] from `--auth USER:PASS` and/or `--auth-file` (one USER:PASS per line, # comments);
    None when neither is given. A password never appears in an error message."""
    pairs: list[tuple[str, str]] = []
    sources: list[tuple[str, str]] = []
    if auth is not None:
        sources.append(("--auth", auth))
    if auth_file is not None:
        try:
            text = Path(auth_file).expanduser().read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise CodeParrotError(f"--auth-file {auth_file}: cannot read it ({type(err).__name__})") from None
        sources += [(f"--auth-file {auth_file} line {i}", line.strip()) for i, line in enumerate(text.splitlines(), 1)
                    if line.strip() and not line.lstrip().startswith("#")]
        if not any(src.startswith("--auth-file") for src, _ in sources):
            raise CodeParrotError(f"--auth-file {auth_file}: no USER:PASS line")
    for where, value in sources:
        user, sep, password = value.partition(":")
        if not sep or not user.strip() or not password:
            raise CodeParrotError(f"{where}: expected USER:PASS with a non-empty user and password")
        pairs.append((user.strip(), password))
    return pairs or None


def check_port_number(port: int) -> None:
    """A one-line error for a port outside 0..65535 (0: a free port the OS picks, `server.check_port`)."""
    if not 0 <= port <= 65535:
        raise CodeParrotError(f"--port must be in 0..65535 (0: a free port), got {port}")


def check_exposure(host: str, credentials: list | None, allow_unauthenticated: bool) -> None:
    """Refuse to serve a non-loopback address without a login, unless explicitly allowed."""
    if credentials or allow_unauthenticated or is_loopback(host):
        return
    raise CodeParrotError(
        f"--host {host} exposes the app beyond this machine, and anyone who reaches it could run models on this "
        "server and promote checkpoints to main: give --auth USER:PASS or --auth-file FILE, or "
        "--allow-unauthenticated if something in front of it (a proxy) authenticates")


def confined_folder(data_dir: Path | None, requested: str) -> Path:
    """The folder `requested` names (relative to `data_dir`, or absolute) when it lies under `data_dir` with every
    symlink resolved, and so does everything in it; otherwise a one-line error that names only `requested`."""
    if data_dir is None:
        raise CodeParrotError("computing losses on a validation folder needs the app started with --data-dir (the "
                              "folder it may read); leave the field empty for the losses the runs logged")
    root = Path(data_dir).resolve()
    text = requested.strip()
    refusal = CodeParrotError(f"validation folder {text!r} is not a folder inside the app's data folder "
                              "(--data-dir); give a path relative to it, e.g. valid")
    if "\0" in text:
        raise refusal
    candidate = Path(text).expanduser() if os.path.isabs(text) or text.startswith("~") else root / text
    try:
        folder = candidate.resolve()
    except (OSError, RuntimeError):  # a symlink loop
        raise refusal from None
    if not folder.is_relative_to(root) or not folder.is_dir():
        raise refusal
    for entry in folder.rglob("*"):  # a symlink inside pointing out (a file or a folder) would be read too
        try:
            inside = entry.resolve().is_relative_to(root)
        except (OSError, RuntimeError):
            inside = False
        if not inside:
            raise refusal
    return folder


def bounded_steps(steps) -> int:
    """Batches per checkpoint: an integer in 1..MAX_EVAL_STEPS (never -1, "the whole dataset")."""
    return whole_number(steps, "batches per checkpoint", within=(1, MAX_EVAL_STEPS))
