"""Local checkpoint repository: a real git repository driven through plumbing commands.

The repository is bare (created with `git init --bare`): checkpoints are committed on branches without a
worktree to keep in sync, and it can be cloned, pushed to a remote or inspected with ordinary git. An
existing non-bare repository works too, except for committing to the branch its worktree has checked out.

A commit of a folder never touches the folder or any worktree: a throwaway index (`GIT_INDEX_FILE`) is
filled with `git add` from the folder as a temporary work tree, written as a tree, committed with
`commit-tree`, and the branch moved with `update-ref` compare-and-swap. Writers are serialized by a lock file
in the git directory (`flock`), so concurrent pushes from several runs cannot lose a commit.

Large files: when `git lfs` is installed the repository is created with LFS tracking for weight files
(`*.safetensors`, `*.bin`, `*.pt`, ...), the objects living in the repository's own `lfs/` folder; without it
(the common case on CI machines) weights are plain git blobs, stored uncompressed (zlib saves about 7% on fp32
weights at 4x the time: 5 s instead of 46 s to commit codeparrot-small's 444 MB on 2 busy cores) and never
delta-searched (`core.bigFileThreshold`). `lfs_enabled` says which mode a repository uses. Every tree committed
in LFS mode carries a `.gitattributes` with the LFS rules, so a `git clone` (with git-lfs installed) converts
the pointers back into weights; a revision whose files are still LFS pointers (a clone without git-lfs, or
before `git lfs pull`) is refused when materialized, never handed to `from_pretrained` or cached.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Iterator

from codeparrot.atomic_io import atomic_dir
from codeparrot.errors import CodeParrotError
from codeparrot.file_lock import exclusive_lock
from codeparrot.repository.base import (
    BranchInfo,
    CheckpointRepository,
    CommitInfo,
    check_commit_folder,
    main_then_newest,
    parse_step,
    promotion_message,
    run_mark,
    validate_branch_name,
    validate_revision,
)

GIT_IDENTITY = ("CodeParrot", "codeparrot@localhost")
ZERO_ID = "0" * 40
LFS_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.npy", "*.h5", "*.msgpack", "*.gguf")
LFS_ATTRIBUTES = "".join(f"{p} filter=lfs diff=lfs merge=lfs -text\n" for p in LFS_PATTERNS)
# How every git-lfs pointer file starts (https://github.com/git-lfs/git-lfs/blob/main/docs/spec.md); pointers are
# smaller than 1024 bytes.
LFS_POINTER_PREFIX = b"version https://git-lfs.github.com/spec/v1\n"
# Settings that make commits independent of the user's global git config (CRLF conversion, signing, ...).
_GIT_CONFIG = (
    f"user.name={GIT_IDENTITY[0]}", f"user.email={GIT_IDENTITY[1]}", "commit.gpgSign=false",
    "core.autocrlf=false", "core.safecrlf=false", "core.fsmonitor=false", "core.quotePath=false",
    "core.hooksPath=/dev/null",
)


def is_git_repository(path: Path) -> bool:
    """Whether `path` itself is a git directory (bare) or the top of a worktree (has `.git`).

    Deliberately not `git rev-parse`: that would accept any folder inside some enclosing repository.
    """
    path = Path(path)
    if (path / ".git").exists():
        return True
    return (path / "HEAD").is_file() and (path / "objects").is_dir() and (path / "refs").is_dir()


@functools.lru_cache(maxsize=1)
def git_lfs_available() -> bool:
    """Whether the `git lfs` extension is installed."""
    try:
        return subprocess.run(["git", "lfs", "version"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def lfs_pointers(folder: Path) -> list[Path]:
    """The files under `folder` (its `.git` aside) that are git-lfs pointer files rather than their contents."""
    found = []
    for path in sorted(Path(folder).rglob("*")):
        if ".git" in path.relative_to(folder).parts or path.is_symlink() or not path.is_file():
            continue
        if path.stat().st_size < 1024:
            with open(path, "rb") as f:
                if f.read(len(LFS_POINTER_PREFIX)) == LFS_POINTER_PREFIX:
                    found.append(path)
    return found


def check_no_lfs_pointers(folder: Path, what: str) -> None:
    """A one-line error when `folder` (the files of `what`) holds git-lfs pointers instead of the files."""
    pointers = lfs_pointers(folder)
    if pointers:
        names = ", ".join(str(p.relative_to(folder)) for p in pointers[:3]) + (", ..." if len(pointers) > 3 else "")
        verb = "is a git-lfs pointer" if len(pointers) == 1 else "are git-lfs pointers"
        raise CodeParrotError(f"{what}: {names} {verb}, not the file's contents: install git-lfs and run "
                              "`git lfs pull` in the clone (or use the original repository)")


def _git_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")}
    env.update(GIT_TERMINAL_PROMPT="0", LC_ALL="C")
    env.update(extra or {})
    return env


class LocalGitRepository(CheckpointRepository):
    """A checkpoint repository in a local (bare) git repository at `path`."""

    def __init__(self, path: str | os.PathLike, create: bool = False, use_lfs: bool | None = None):
        self.path = Path(path)
        self.ref = str(self.path)
        if shutil.which("git") is None:
            raise CodeParrotError("git is not installed; local checkpoint repositories need it")
        self.created = False  # whether this object made the repository (not another process racing it)
        self._writers, self._holding, self._warned_no_locks = threading.RLock(), False, False  # `locked`
        empty_dir = self.path.is_dir() and not any(self.path.iterdir())
        if not self.path.exists() or (create and empty_dir):
            if not create:
                raise CodeParrotError(f"repository not found: {self.path} (scripts/initialize_model.py creates one)")
            self._init(use_lfs, empty_dir)
        if not is_git_repository(self.path):
            raise CodeParrotError(f"{self.path} exists but is not a git repository")
        bare = not (self.path / ".git").exists()
        self.git_dir = self.path if bare else Path(self._run(["git", "-C", str(self.path), "rev-parse",
                                                             "--absolute-git-dir"]).strip())
        self.bare = bare
        self.lfs_enabled = self._config("codeparrot.lfs") == "true"
        if self.lfs_enabled and not git_lfs_available():
            raise CodeParrotError(f"{self.path} stores weights with git-lfs, which is not installed here "
                                  "(install git-lfs, e.g. apt-get install git-lfs)")

    # -- plumbing helpers -------------------------------------------------------------------------------

    def _run(self, cmd: list[str], input: bytes | None = None, env: dict | None = None, check: bool = True,
             what: str = "git") -> str:
        try:
            proc = subprocess.run(cmd, input=input, capture_output=True, env=_git_env(env))
        except OSError as err:
            raise CodeParrotError(f"cannot run git: {err}") from None
        if check and proc.returncode != 0:
            msg = proc.stderr.decode(errors="replace").strip().splitlines()
            raise CodeParrotError(f"{what} failed in {self.ref}: {msg[-1] if msg else f'exit {proc.returncode}'}")
        return proc.stdout.decode("utf-8", errors="replace")

    def _git(self, *args: str, input: bytes | None = None, env: dict | None = None, check: bool = True,
             work_tree: Path | None = None) -> str:
        cmd = ["git", f"--git-dir={self.git_dir}"]
        if work_tree is not None:
            cmd.append(f"--work-tree={work_tree}")
        for setting in _GIT_CONFIG:
            cmd += ["-c", setting]
        return self._run(cmd + list(args), input=input, env=env, check=check, what=f"git {args[0]}")

    def _config(self, key: str) -> str | None:
        out = self._run(["git", f"--git-dir={self.git_dir}", "config", "--get", key], check=False).strip()
        return out or None

    def _init(self, use_lfs: bool | None, empty_dir: bool = False) -> None:
        """Create a bare repository atomically (a failed init leaves nothing behind). Where another process
        creates the same repository at the same moment, one of them publishes it and the other uses it (sets
        `created` only in the one that published). `empty_dir`: `path` is an existing empty folder, taken over."""

        lfs = git_lfs_available() if use_lfs is None else use_lfs
        if lfs and not git_lfs_available():
            raise CodeParrotError("use_lfs=True but git lfs is not installed")
        if empty_dir:
            try:
                self.path.rmdir()  # published in its place below; it was empty, nothing is lost
            except FileNotFoundError:
                pass  # another process took it over first: theirs or ours, whichever publishes
            except OSError:
                return  # no longer empty: another process created the repository in it
        try:
            self._publish_new(lfs)
        except FileExistsError:
            return  # another process published its repository first: this one opens that (never replaces it)
        except BaseException:
            if empty_dir:
                self.path.mkdir(exist_ok=True)  # the empty folder the user gave, as it was
            raise
        self.created = True

    def _publish_new(self, lfs: bool) -> None:
        with atomic_dir(self.path, replace=False) as tmp:
            self._run(["git", "init", "--quiet", "--bare", "--initial-branch=main", str(tmp)])
            settings = [("core.compression", "0"),  # weights barely compress (~7%); zlib even at level 1 is 4x slower
                        ("core.bigFileThreshold", "16m"),  # stream big blobs, never delta-search them
                        ("codeparrot.lfs", "true" if lfs else "false")]
            for key, value in settings:
                self._run(["git", f"--git-dir={tmp}", "config", key, value])
            if lfs:
                self._run(["git", f"--git-dir={tmp}", "lfs", "install", "--local"], env={"GIT_DIR": str(tmp)})
                # info/attributes applies to every tree this repository builds, without a .gitattributes file
                # in the user's folder; each commit also carries them as .gitattributes (`_add_lfs_attributes`),
                # because info/attributes is not cloned.
                (tmp / "info").mkdir(exist_ok=True)
                (tmp / "info" / "attributes").write_text(LFS_ATTRIBUTES)
            (tmp / "description").write_text("CodeParrot checkpoints: one branch per experiment\n")

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The writers' lock (several runs pushing to one repository), held for the block: every write takes it, and
        a caller takes it around a check and the commit the check allows (`initialize_model`), so that no other writer
        commits in between. A waiting writer says for whom. Taken again by the same thread, it is already held."""
        with self._writers:  # threads sharing this object queue here; a second flock of ours would wait for itself
            if self._holding:
                yield
                return
            lock = self.git_dir / "codeparrot.lock"
            with exclusive_lock(lock, f"process {os.getpid()} on {socket.gethostname()}", lambda other: (
                    f"waiting for the lock on {self.ref} held by {other or 'another process'}"),
                    unsupported=lambda err: self._without_lock(lock, err)):
                self._holding = True
                try:
                    yield
                finally:
                    self._holding = False

    def _without_lock(self, lock: Path, err: OSError) -> None:
        """A filesystem without locks (NFS without its lock daemon): the writes go on, since git's compare-and-swap
        of the branch (`update-ref` with the old value) still refuses a lost update; said once per repository."""
        if not self._warned_no_locks:
            self._warned_no_locks = True
            print(f"note: {lock} cannot be locked here ({err.strerror}); writers of {self.ref} are not serialized "
                  "(a concurrent push to the same branch fails instead of waiting)", file=sys.stderr, flush=True)

    def _rev(self, revision: str) -> str | None:
        out = self._git("rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}", check=False).strip()
        return out or None

    def _branch_tip(self, branch: str) -> str | None:
        return self._rev(f"refs/heads/{branch}")

    def _branch_names(self) -> list[str]:
        # split on "\n" only: git allows names with other Unicode separators (U+0085, U+2028), which
        # str.split()/splitlines() would cut in two
        return [n for n in self._git("for-each-ref", "--format=%(refname:lstrip=2)", "refs/heads").split("\n") if n]

    def _check_not_checked_out(self, branch: str) -> None:
        if self.bare:
            return
        head = self._git("symbolic-ref", "--quiet", "--short", "HEAD", check=False).strip()
        if head == branch:
            raise CodeParrotError(f"branch {branch!r} is checked out in the worktree of {self.path}; commit to "
                                  "another branch or use a bare repository (initialize_model.py creates one)")

    def _commit_tree(self, tree: str, parent: str | None, message: str) -> str:
        args = ["commit-tree", tree] + (["-p", parent] if parent else []) + ["-F", "-"]
        return self._git(*args, input=message.encode("utf-8")).strip()

    def _move_branch(self, branch: str, new: str, old: str | None, message: str) -> None:
        self._git("update-ref", "-m", message.splitlines()[0], f"refs/heads/{branch}", new, old or ZERO_ID)

    # -- the interface ----------------------------------------------------------------------------------

    def resolve_revision(self, revision: str) -> str:
        validate_revision(revision)
        commit = self._branch_tip(revision) or self._rev(revision)
        if commit is None:
            names = ", ".join(self._branch_names()) or "none yet"
            raise CodeParrotError(f"revision {revision!r} not found in {self.ref} (branches: {names})")
        return commit

    def create_branch(self, branch: str, from_revision: str = "main") -> None:
        validate_branch_name(branch)
        with self.locked():
            if self._branch_tip(branch) is not None:
                return
            base = self._branch_tip(from_revision) or self._rev(validate_revision(from_revision))
            if base is None:
                if from_revision == "main" and not self._branch_names():
                    return  # empty repository: the branch is born with its first commit
                self.resolve_revision(from_revision)  # raises the one-line "not found" error
            self._move_branch(branch, base, None, f"branch: created from {from_revision}")

    def commit_folder(self, folder: str | os.PathLike, branch: str, message: str) -> str:
        folder = check_commit_folder(folder)
        validate_branch_name(branch)
        if not message.strip():
            raise CodeParrotError("a commit needs a message")
        self._check_not_checked_out(branch)
        with self.locked(), tempfile.TemporaryDirectory(prefix="codeparrot-index-") as tmp:
            parent = old = self._branch_tip(branch)
            if parent is None and branch != "main":
                parent = self._branch_tip("main")  # a new experiment branches off the main model
            # A throwaway index: the folder becomes the whole tree (files absent from it are not carried over).
            env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
            self._git("add", "--all", "--force", "--", ".", env=env, work_tree=folder.resolve())
            if self.lfs_enabled:
                self._add_lfs_attributes(env)
            tree = self._git("write-tree", env=env).strip()
            commit = self._commit_tree(tree, parent, message)
            self._move_branch(branch, commit, old, message)
        return commit

    def _add_lfs_attributes(self, env: dict[str, str]) -> None:
        """Put the LFS rules into the tree as `.gitattributes` (merged into the folder's own, if it has one): a
        `git clone` does not copy the repository's info/attributes, and without the rules in the tree git-lfs
        leaves the clone's weights as pointer files."""
        own = self._git("cat-file", "blob", ":.gitattributes", env=env, check=False)
        missing = [line for line in LFS_ATTRIBUTES.splitlines(keepends=True) if line.strip() not in own.splitlines()]
        if not missing:
            return
        text = (own if not own or own.endswith("\n") else own + "\n") + "".join(missing)
        blob = self._git("hash-object", "-w", "--stdin", input=text.encode("utf-8")).strip()
        self._git("update-index", "--add", "--cacheinfo", f"100644,{blob},.gitattributes", env=env)

    def list_branches(self) -> list[BranchInfo]:
        fmt = "%(refname:lstrip=2)%00%(objectname)%00%(committerdate:iso-strict)%00%(contents:subject)"
        branches = []
        for line in self._git("for-each-ref", f"--format={fmt}", "refs/heads").split("\n"):  # not splitlines
            if not line:
                continue
            name, commit, date, subject = line.split("\0", 3)
            step = parse_step(subject)
            if step is None and subject.strip() != "initial model":
                step = self.latest_step_message(name)
            branches.append(BranchInfo(name=name, commit_id=commit, date=date, latest_step=step))
        return main_then_newest(branches)

    def list_commits(self, branch: str) -> list[CommitInfo]:
        validate_branch_name(branch)
        if self._branch_tip(branch) is None:
            names = ", ".join(self._branch_names()) or "none yet"
            raise CodeParrotError(f"branch {branch!r} not found in {self.ref} (branches: {names})")
        # -z: records end with NUL; a message cannot hold one, so the fields are NUL-separated too (4 per commit)
        out = self._git("log", "-z", "--first-parent", "--format=%H%x00%cI%x00%s%x00%b", f"refs/heads/{branch}",
                        "--")
        fields = out.split("\0")
        commits = []
        for i in range(0, len(fields) - 3, 4):
            commit, date, subject, body = fields[i:i + 4]
            commits.append(CommitInfo(commit_id=commit.strip("\n"), message=subject, date=date,
                                      step=parse_step(subject), run=run_mark(body)))
        return commits

    def checkout_into(self, commit: str, dest: Path) -> None:
        """Write the files of `commit` into the existing folder `dest` (LFS objects expanded). Files left as
        git-lfs pointers (git-lfs missing, or a clone whose LFS objects were never fetched) are a one-line error:
        they are no weights, and `dest` may be a cache folder named by the commit id."""
        with tempfile.TemporaryDirectory(prefix="codeparrot-index-") as tmp:
            env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
            self._git("read-tree", commit, env=env, work_tree=dest)
            self._git("checkout-index", "--all", "--force", env=env, work_tree=dest)
        attributes = dest / ".gitattributes"
        if attributes.is_file() and attributes.read_text(encoding="utf-8", errors="replace") == LFS_ATTRIBUTES:
            attributes.unlink()  # the rules `_add_lfs_attributes` added: not one of the committed folder's files
        check_no_lfs_pointers(dest, f"{self.ref} at {commit[:12]}")

    def _write_revision(self, revision: str, folder: Path) -> None:
        self.checkout_into(self.resolve_revision(revision), folder)

    def promote(self, revision: str) -> str:
        source = self.resolve_revision(revision)
        subject = self._git("log", "-1", "--format=%s", source, "--").strip()
        title, body = promotion_message(revision, source, subject)
        message = f"{title}\n\n{body}\n"
        with self.locked():
            parent = self._branch_tip("main")
            self._check_not_checked_out("main")
            tree = self._git("rev-parse", f"{source}^{{tree}}").strip()  # same files, no copying
            if parent is not None and self._git("rev-parse", f"{parent}^{{tree}}").strip() == tree:
                return parent  # main holds exactly these files already: a second promotion adds no commit
            commit = self._commit_tree(tree, parent, message)
            self._move_branch("main", commit, parent, message)
        return commit
