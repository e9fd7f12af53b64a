"""Which weights a run samples, pinned so that what it made can be reproduced: the commit a revision names
(`pinned_commit`) and the dtype the weights were loaded in (`weights_dtype`). The tokenizer is loaded from the same
folder as the model, so the commit pins it too. HumanEval records both with its samples (and a resumed run never
mixes the samples of two checkpoints); scripts/generate.py records them in its --output.

Where no commit names the files (a plain folder, a worktree with changed files), `weights_fingerprint` stands in
for it: a fingerprint of the files the model and tokenizer load from, so a resumed run still refuses other weights.

A branch name is not enough: a local repository's branch moves as training pushes checkpoints, a Hub branch moves
with every upload. So the commit is resolved once, before anything loads, the run loads exactly it
(`load_revision` says what is loaded), and records it.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path
from typing import Any

from codeparrot.errors import CodeParrotError
from codeparrot.repository.base import is_hub_ref, strip_scheme
from codeparrot.repository.local import LocalGitRepository, is_git_repository
from codeparrot.safetensors_header import end_of_data, read_safetensors_header

FULL_COMMIT = re.compile(r"[0-9a-f]{40}")


def pinned_commit(model: str, revision: str | None, api: Any = None) -> str | None:
    """The commit that `revision` (default main) of the repository `model` names now, which the run loads and
    records. None where there is no commit to pin: a plain folder, a worktree whose files are not exactly a
    commit's (`worktree_commit`), a Hub revision offline and not in the local cache, or a path that does not
    exist (loading the model says why). `api`: the `HfApi` asked about Hub revisions (tests pass a stand-in)."""
    if is_hub_ref(model):
        return hub_commit(strip_scheme(model), revision, api)
    path = Path(strip_scheme(model)).expanduser()
    if not path.exists() or not is_git_repository(path):
        return None
    if revision is None and (path / ".git").exists():  # a worktree used as checked out
        return worktree_commit(path)
    return LocalGitRepository(path).resolve_revision(revision or "main")


def load_revision(model: str, revision: str | None, commit: str | None) -> str | None:
    """What to load for `model` at `revision`, whose files `commit` (`pinned_commit`) names: that commit, so every
    process loads the weights recorded even after the branch moves; except a worktree used as checked out (no
    --revision), loaded in place (its files are that commit's), not copied out of the repository into the cache."""
    in_place = revision is None and not is_hub_ref(model) and (Path(strip_scheme(model)).expanduser() / ".git").exists()
    return revision if in_place else commit or revision


def hub_commit(repo_id: str, revision: str | None, api: Any = None) -> str | None:
    """The commit `revision` (default main) of the Hub repository `repo_id` names: a full commit id as given; online,
    what the Hub answers (one request, without downloading anything); offline (HF_HUB_OFFLINE=1), or online with
    the Hub out of reach, the commit the local Hub cache records for the revision, which is what loading will use
    then too (None offline when it has no record)."""
    from huggingface_hub import HfApi, constants, errors

    from codeparrot.repository.hub import hub_error

    revision = revision or "main"
    if FULL_COMMIT.fullmatch(revision):
        return revision
    if constants.HF_HUB_OFFLINE:
        return _cached_commit(repo_id, revision)
    try:
        sha = (api or HfApi()).model_info(repo_id, revision=revision).sha
    except Exception as err:  # HTTP, network, unknown repository or revision: a one-line error naming them
        # no answer at all (no network, a timeout): loading falls back to the cache, so the pin does too
        cached = None if isinstance(err, errors.HfHubHTTPError) else _cached_commit(repo_id, revision)
        if cached is None:
            raise hub_error(err, "resolving", repo_id, revision) from None
        return cached
    return sha if isinstance(sha, str) and FULL_COMMIT.fullmatch(sha) else None


def _cached_commit(repo_id: str, revision: str) -> str | None:
    """The commit the local Hub cache records for `revision` (its snapshots are folders named by commit;
    config.json is in every model snapshot), or None."""
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    return Path(cached).parent.name if isinstance(cached, str) else None


def worktree_commit(path: Path) -> str | None:
    """HEAD of the git worktree at `path` when its files are exactly that commit's, else None: with a changed,
    untracked or ignored file (weights can be any of them), or no commit at all, a commit id would pin nothing."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}  # the worktree's own repository
    try:
        status = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "--ignored"], capture_output=True,
                                env={**env, "LC_ALL": "C"}, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if status.returncode != 0 or status.stdout.strip():
        return None
    try:
        return LocalGitRepository(path).resolve_revision("HEAD")
    except CodeParrotError:  # no commit yet
        return None


def weights_dtype(model) -> str:
    """The dtype the weights were loaded in ("float32" on CPU; the saved one, e.g. "bfloat16", on a GPU): the same
    commit sampled in another dtype gives other samples."""
    return str(next(model.parameters()).dtype).removeprefix("torch.")


# Files hashed whole up to this size (config, tokenizer, small models: well under 0.1 s). Larger ones are sampled:
# sha256 runs at ~0.5-0.7 GB/s here, so a 1.5B-parameter fp32 model (6 GB) would cost 8-12 s with the file in the
# page cache and more from a cold disk, in every process, before every run; a sample costs milliseconds.
WHOLE_FILE_BYTES = 64 << 20
SAMPLE_BYTES = 4096
EVEN_SAMPLES = 1024  # windows spread over a large file that is not safetensors
TOKENIZER_FILES = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "added_tokens.json"}


def weights_fingerprint(model: str, commit: str | None) -> dict[str, str] | None:
    """{file name: fingerprint} of what loads from the local folder `model` where no commit pins it (`commit` None:
    a plain folder, a worktree whose files are not a commit's): config.json, the weight files and the tokenizer's.
    None where a commit pins the files, or where there is no local folder (loading then says why)."""
    if commit is not None or is_hub_ref(model):
        return None
    folder = Path(strip_scheme(model)).expanduser()
    if not folder.is_dir():
        return None
    try:
        return {path.name: file_fingerprint(path) for path in sorted(folder.iterdir())
                if path.is_file() and _loaded_file(path.name)}
    except OSError as err:
        raise CodeParrotError(f"cannot read {err.filename or folder} to fingerprint the weights: "
                              f"{err.strerror or err}") from None


def _loaded_file(name: str) -> bool:
    return (name == "config.json" or name in TOKENIZER_FILES or name.endswith((".safetensors", ".bin"))
            or name.endswith(".index.json"))  # the index of sharded weights


def file_fingerprint(path: Path) -> str:
    """"sha256:HEX" of a file up to WHOLE_FILE_BYTES; above, "sampled-sha256:HEX" of its size, its safetensors header
    (every tensor's name, dtype, shape and place) and SAMPLE_BYTES at the start, middle and end of every tensor
    (another checkpoint of the same model, even one with a single layer retrained, differs in all of them). An edit
    confined to bytes outside those samples goes unseen: the price of not reading gigabytes at every start."""
    size = path.stat().st_size
    digest = hashlib.sha256(f"{size}\0".encode())
    with open(path, "rb") as f:
        if size <= WHOLE_FILE_BYTES:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
            return f"sha256:{digest.hexdigest()}"
        for start, length in _sample_windows(f, size):
            f.seek(start)
            digest.update(f.read(length))
    return f"sampled-sha256:{digest.hexdigest()}"


def _sample_windows(f, size: int) -> list[tuple[int, int]]:
    """(start, length) of the parts of a large file that `file_fingerprint` reads: a safetensors file's header and
    the start, middle and end of each tensor; any other file's EVEN_SAMPLES windows spread evenly."""
    try:
        data, entries = read_safetensors_header(f, size)
    except ValueError:
        data, entries = 0, None
    if entries is None or data + end_of_data(entries) > size:  # not safetensors (or not a whole one)
        step = max(size // EVEN_SAMPLES, 1)
        return [(start, SAMPLE_BYTES) for start in range(0, size, step)]
    windows = [(0, data)]
    for entry in entries.values():
        begin, end = (data + offset for offset in entry["data_offsets"])
        width = min(SAMPLE_BYTES, end - begin)
        windows += [(begin, width), ((begin + end - width) // 2, width), (end - width, width)]
    return sorted(set(windows))
