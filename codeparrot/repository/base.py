"""Checkpoint repositories, what both backends share: the interface, the types, validators and helpers.

- `user/name` (or `hf://user/name`): a Hugging Face Hub model repository (`hub.py`, `HfApi`).
- a filesystem path (or `file://PATH`): a local git repository (`local.py`), the offline default.

Every experiment is a branch; every checkpoint is one commit ("step N") holding the files needed to use or
resume the model; `main` holds the "initial model" and, later, the promoted best checkpoint.

How a reference is read: `hf://...` is the Hub, `file://...` or anything starting with `/`, `.` or `~` is a
path, an existing path is a path; otherwise `owner/name` (one slash, Hub-legal characters) is the Hub when
no directory `owner` exists here, and anything else is a path. So `./models/small` is always local, while
`models/small` is the Hub id models/small unless a folder `models` exists here. A pasted Hub address
`https://huggingface.co/OWNER/NAME` reads as `hf://OWNER/NAME`; any other `scheme://` is refused (a URL is no
folder name, and one with a token in it must not become one).
"""

from __future__ import annotations

import abc
import logging
import os
import re
import unicodedata
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from codeparrot.atomic_io import atomic_dir
from codeparrot.errors import CodeParrotError
from codeparrot.redaction import scrub_secrets

_STEP_RE = re.compile(r"\bstep[ _-]?(\d+)\b", re.IGNORECASE)
_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")
_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://([^/?#]*)")
_HUB_URL_RE = re.compile(r"^https://huggingface\.co/([^/?#@:]+/[^/?#@:]+?)/?$")
INITIAL_MESSAGE = "initial model"
# The trailer the pusher adds to every checkpoint commit it makes: which run pushed it. A branch started from
# another experiment's branch holds that experiment's "step N" commits too (same step numbers); the mark tells
# them apart (`metrics.branch_checkpoints`).
RUN_TRAILER = "CodeParrot-Run"
_RUN_TRAILER_RE = re.compile(rf"^{RUN_TRAILER}: *(\S.*?) *$", re.MULTILINE)
logger = logging.getLogger(__name__)


def parse_step(message: str) -> int | None:
    """The training step a commit message names ("step 1200", "promote run@abc (step 1200)"), else None."""
    first_line = message.strip().splitlines()[0] if message.strip() else ""
    match = _STEP_RE.search(first_line)
    return int(match.group(1)) if match else None


@dataclass
class CommitInfo:
    """One checkpoint: a commit on a branch."""

    commit_id: str
    message: str  # first line
    date: str  # ISO 8601
    step: int | None  # parsed from the message; None for "initial model" and other non-step commits
    run: str | None = None  # the run that pushed it (its `CodeParrot-Run:` trailer); None: no mark


@dataclass
class BranchInfo:
    """One experiment: a branch and its newest checkpoint."""

    name: str
    commit_id: str
    date: str  # ISO 8601 date of the newest commit
    latest_step: int | None  # step of the newest commit that names one; None if none does


class CheckpointRepository(abc.ABC):
    """The operations both backends provide. Errors are `CodeParrotError` naming the repository/branch."""

    ref: str

    @abc.abstractmethod
    def create_branch(self, branch: str, from_revision: str = "main") -> None:
        """Create `branch` at `from_revision`; nothing happens if it exists (idempotent)."""

    @abc.abstractmethod
    def commit_folder(self, folder: str | os.PathLike, branch: str, message: str) -> str:
        """One commit on `branch` whose tree is exactly the files of `folder`; returns the commit id.
        A missing branch is created from `main` first."""

    @abc.abstractmethod
    def list_branches(self) -> list[BranchInfo]:
        """Every branch, `main` first, then newest first."""

    @abc.abstractmethod
    def list_commits(self, branch: str) -> list[CommitInfo]:
        """Commits on `branch`, newest first."""

    def download(self, revision: str, output_dir: str | os.PathLike) -> Path:
        """Materialize `revision` (branch, tag or commit id) as a new folder that `from_pretrained` loads
        (written atomically; an existing non-empty `output_dir` is refused)."""

        output_dir = Path(output_dir)
        if output_dir.exists() and (not output_dir.is_dir() or any(output_dir.iterdir())):
            raise CodeParrotError(f"output directory {output_dir} already exists and is not empty")
        with atomic_dir(output_dir) as tmp:
            self._write_revision(revision, tmp)
        return output_dir

    @abc.abstractmethod
    def _write_revision(self, revision: str, folder: Path) -> None:
        """Write the files of `revision` into the existing, empty `folder`."""

    @abc.abstractmethod
    def promote(self, revision: str) -> str:
        """A new commit on `main` with exactly the files of `revision`, its message naming the source."""

    def resolve_revision(self, revision: str) -> str:
        """The full commit id of `revision`; `CodeParrotError` if it does not exist."""
        raise NotImplementedError

    def commit_folder_async(self, folder: str | os.PathLike, branch: str, message: str):
        """`commit_folder` returning a `concurrent.futures.Future` of the commit id (default: run inline)."""

        future: Future = Future()
        try:
            future.set_result(self.commit_folder(folder, branch, message))
        except BaseException as err:  # noqa: BLE001 - handed to the caller through the future
            future.set_exception(err)
        return future

    def latest_step_message(self, branch: str) -> int | None:
        """The step of the newest commit on `branch` that names one (None if none does)."""
        for commit in self.list_commits(branch):
            if commit.step is not None:
                return commit.step
        return None


def check_commit_folder(folder: str | os.PathLike) -> Path:
    """`folder` as a Path when it can be committed: a folder holding at least one file."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CodeParrotError(f"cannot commit {folder}: not a folder")
    if not any(p.is_file() for p in folder.rglob("*")):
        raise CodeParrotError(f"cannot commit {folder}: it holds no files")
    return folder


def run_mark(body: str | None) -> str | None:
    """The run named by the `CodeParrot-Run:` trailer in a commit message's body, else None."""
    marks = _RUN_TRAILER_RE.findall(body or "")
    return marks[-1] if marks else None


def with_run_mark(message: str, run: str) -> str:
    """`message` with the trailer that marks the commit as pushed by `run` (the subject is left as it is)."""
    return f"{message.rstrip()}\n\n{RUN_TRAILER}: {run}\n"


def _instant(date: str) -> datetime:
    """An ISO 8601 date as an aware datetime (any offset); unreadable or empty (a mirror gave none): the oldest."""
    try:
        when = datetime.fromisoformat(date)
    except (TypeError, ValueError):
        return datetime.min.replace(tzinfo=timezone.utc)
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def main_then_newest(branches: list[BranchInfo]) -> list[BranchInfo]:
    """`list_branches` order: `main` first, then the others newest first (by the instant: the date strings carry
    the offset of the machine that committed, so they do not sort as text)."""
    newest_first = sorted(branches, key=lambda b: _instant(b.date), reverse=True)
    return sorted(newest_first, key=lambda b: b.name != "main")  # stable: keeps newest first after main


def promotion_message(revision: str, source: str, source_message: str) -> tuple[str, str]:
    """(subject, body) of the commit that promotes `revision` (resolved to commit `source`) onto main."""
    step = parse_step(source_message)
    what = source[:12] if source.startswith(revision) else f"{revision}@{source[:12]}"  # no commit id twice
    subject = f"promote {what} ({f'step {step}' if step is not None else source_message})"
    return subject, f"Source commit: {source}\nSource message: {source_message}"


def validate_branch_name(branch: str) -> str:
    """Reject names git and the Hub both refuse (or that would read as options), with a one-line error. Unicode
    control, format and separator characters (U+0085, U+2028, a no-break space, ...) are refused too: git accepts
    them, but they split a name in listings and look like plain spaces (or nothing) when printed."""
    bad = (not branch or branch.startswith(("-", "/", ".")) or branch.endswith(("/", ".", ".lock"))
           or ".." in branch or "//" in branch or "@{" in branch or any(c in branch for c in " ~^:?*[\\\t\n")
           or any(unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zs", "Zl", "Zp") for c in branch))
    if bad:
        raise CodeParrotError(f"invalid branch name {branch!r} (no spaces, '..', '~^:?*[\\', control or separator "
                              "characters, leading '-' or '.')")
    return branch


def validate_revision(revision: str) -> str:
    """A revision must not look like a command-line option or contain control characters."""
    if not revision or revision.startswith("-") or any(ord(c) < 32 for c in revision):
        raise CodeParrotError(f"invalid revision {revision!r}")
    return revision


def check_reference(ref: str) -> str:
    """`ref` as the reference it stands for: a pasted `https://huggingface.co/OWNER/NAME` is `hf://OWNER/NAME`;
    any other `scheme://` but `hf://` and `file://` is a one-line error that never repeats the URL's
    credentials (without it, the URL would become a local folder named after it, token included)."""
    ref = str(ref)
    hub_url = _HUB_URL_RE.match(ref)
    if hub_url and _HUB_ID_RE.match(hub_url.group(1)):
        return f"hf://{hub_url.group(1)}"
    scheme = _SCHEME_RE.match(ref)
    if scheme and scheme.group(1).lower() not in ("hf", "file"):
        host = scheme.group(2).rsplit("@", 1)[-1]  # what comes before an "@" is credentials: never shown
        advice = ("; credentials in the URL are never used (log in with `hf auth login` or set HF_TOKEN)"
                  if "@" in scheme.group(2) else "")
        raise CodeParrotError(scrub_secrets(
            f"unsupported repository reference {scheme.group(1)}://{host}/...: use OWNER/NAME or hf://OWNER/NAME for "
            f"a Hub repository, a path or file://PATH for a local one{advice}"))
    return ref


def is_hub_ref(ref: str) -> bool:
    """Whether `ref` names a Hub repository rather than a local path (see the module docstring); an
    unsupported URL is a one-line error (`check_reference`)."""
    ref = check_reference(ref)
    if ref.startswith("hf://"):
        return True
    if ref.startswith(("file://", "/", ".", "~")) or os.path.exists(ref):
        return False
    return bool(_HUB_ID_RE.match(ref)) and not os.path.isdir(ref.split("/", 1)[0])


def strip_scheme(ref: str) -> str:
    """The Hub id or the path `ref` names, without `hf://` or `file://` (see `check_reference`)."""
    ref = check_reference(ref)
    for scheme in ("hf://", "file://"):
        if ref.startswith(scheme):
            return ref[len(scheme):]
    return ref


def main_state(repo: CheckpointRepository) -> tuple[str | None, bool]:
    """(the commit `main` points at, None without a `main`; whether main's history holds an initial model)."""
    if not any(b.name == "main" for b in repo.list_branches()):
        return None, False
    commits = repo.list_commits("main")
    return (commits[0].commit_id if commits else None), any(c.message == INITIAL_MESSAGE for c in commits)
