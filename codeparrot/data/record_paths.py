"""Which files a data path names: one rule for preprocess (`--input`), train_tokenizer and pretokenize
(`--dataset`), and the training/validation datasets (`data.train`, `data.valid`); `codeparrot.data.records`
re-exports these names.

`resolve_data_files`: each spec is a file, a folder or a glob, in the order given.
- a file named explicitly is read whatever its suffix;
- a folder contributes its `.json`, `.jsonl`, `.json.gz` and `.jsonl.gz` files, searched recursively, sorted;
  hidden files and folders are skipped (an unfinished output's `.name.tmp-*`, a pretokenize `.x.partial`);
- a glob (`**` allowed) contributes the data files it matches, and the folders it matches as above;
- a preprocess output root (a folder with `train/` and/or `valid/` inside) is never read whole, which would
  mix the splits (and its `stats.json`): with `split="train"` it stands for its `train/` folder, otherwise
  it is a one-line error asking for one split; one found inside a folder (`stats.json` beside a split folder)
  is a one-line error too.
A file named twice (say by a folder and a glob) is read once. Missing paths, globs or folders without data
files, and unreadable files or folders (below a folder or met while matching a glob) are one-line
`CodeParrotError`s naming the path: a folder skipped without a word would silently drop its files from the run.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import re
import stat
from pathlib import Path
from typing import Iterable, Iterator, NoReturn

from codeparrot.errors import CodeParrotError

DATA_SUFFIXES = (".json", ".jsonl", ".json.gz", ".jsonl.gz")
SPLITS = ("train", "valid")  # the subfolders of a preprocess output root
# `name` or `owner/name` in the Hub's characters: what a missing data path may also mean (a Hub dataset id)
_HUB_DATASET_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?$")
_FILE_SUFFIXES = (*DATA_SUFFIXES, ".gz", ".parquet", ".arrow", ".csv", ".txt")


def could_be_hub_dataset(spec: str) -> bool:
    """Whether `spec`, when no such path exists, may name a Hub dataset (`name` or `owner/name`) instead. A spec
    starting with `.`, `/` or `~`, with two slashes or more, or ending like a data file is surely a path: a
    missing one is "not found" at once, without asking the Hub (or waiting for it)."""
    return bool(_HUB_DATASET_ID.match(spec)) and not spec.lower().endswith(_FILE_SUFFIXES)


def neither_path_nor_hub(label: str, hub_reason: str) -> CodeParrotError:
    """The one-line error for `label` (a flag and the name it was given), a missing path that
    `could_be_hub_dataset` and that the Hub could not stream either (`hub_reason`, the library's own words):
    both readings named, so that a mistyped folder does not read as a Hub failure only."""
    from huggingface_hub import constants  # only the Hub path pays for the import

    why = ("the Hub is offline: HF_HUB_OFFLINE=1, and the datasets cache does not hold it"
           if constants.HF_HUB_OFFLINE else hub_reason)
    return CodeParrotError(f"{label}: no such file or folder, and not a Hub dataset either ({why})")


def is_data_file(path: Path) -> bool:
    """A regular file or a named pipe (a stream another program writes) with one of the data suffixes."""
    return path.name.endswith(DATA_SUFFIXES) and (path.is_file() or path.is_fifo())


def _unreadable_folder(err: OSError) -> NoReturn:
    raise CodeParrotError(f"input folder is not readable: {err.filename} ({err.strerror or err})")


def _files_under(folder: Path) -> list[Path]:
    """Data files below `folder` (recursively), sorted; hidden files and folders are skipped. A preprocess output
    root below it is an error, as `folder` itself would be: read whole it mixes its splits and its `stats.json`
    (an `--output-dir` inside an input folder would be read back by the next run)."""
    found = []
    # A folder that cannot be listed is a one-line error, never a silent hole in the input (os.walk skips it).
    for root, dirs, files in os.walk(folder, onerror=_unreadable_folder):  # links to folders are not followed
        here = Path(root)
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in dirs:
            nested = here / name
            if os.path.isfile(nested / "stats.json") and split_folders(nested):
                raise CodeParrotError(f"{folder} holds a preprocess output, {nested}: pass its "
                                      f"{' or '.join(split_folders(nested))} folder on its own, or move it out")
        found += [here / f for f in files if not f.startswith(".") and is_data_file(here / f)]
    return sorted(found)


# --- globs: glob.glob(recursive=True)'s matches, but a folder that cannot be listed is an error ----------------
# glob (and pathlib) swallow every OSError of a listing: under `export/**/*.jsonl` a folder without read permission
# simply contributes nothing. These helpers follow glob's rules (`*`, `?`, `[...]` within a name, `**` for any
# folders below, hidden names only where the pattern's name starts with a dot, links followed) and stop instead.
def _names(folder: str, dironly: bool) -> list[str]:
    try:
        with os.scandir(folder or os.curdir) as entries:
            return [e.name for e in entries if not dironly or e.is_dir()]
    except (FileNotFoundError, NotADirectoryError):  # "**" tries every file as a folder; a folder removed meanwhile
        return []
    except OSError as err:
        _unreadable_folder(err)


def _exists(path: str) -> bool:
    """glob's test of a literal name: `path` exists (a link, even broken, counts); a path ending in a separator
    ("q*x/") must be a folder. A folder on the way that cannot be searched is an error, not a miss."""
    try:
        st = os.stat(path) if path.endswith(os.sep) else os.lstat(path)
    except PermissionError as err:
        raise CodeParrotError(f"input folder is not readable: {os.path.dirname(path.rstrip(os.sep)) or os.curdir} "
                              f"({err.strerror or err})") from None
    except (OSError, ValueError):  # missing, a file on the way, a loop of links: no match, as for glob
        return False
    return stat.S_ISDIR(st.st_mode) or not path.endswith(os.sep)


def _below(folder: str, dironly: bool) -> Iterator[str]:
    """Every non-hidden name below `folder`, recursively (relative to it)."""
    for name in _names(folder, dironly):
        if not name.startswith("."):
            yield name
            yield from (os.path.join(name, sub) for sub in _below(os.path.join(folder, name), dironly))


def _glob(pattern: str, dironly: bool = False) -> Iterator[str]:
    """The paths `pattern` matches, as `glob.iglob(pattern, recursive=True)` (same structure as its `_iglob`)."""
    folder, name = os.path.split(pattern)
    if not glob.has_magic(pattern):
        if _exists(pattern):
            yield pattern
        return
    folders = _glob(folder, dironly=True) if folder != pattern and glob.has_magic(folder) else [folder]
    for folder in folders:
        if name == "**":
            names: Iterable[str] = ["", *_below(folder, dironly)]  # "": the folder itself
        elif glob.has_magic(name):
            listed = _names(folder, dironly)
            names = fnmatch.filter(listed if name.startswith(".") else [n for n in listed if not n.startswith(".")],
                                   name)
        else:
            names = [name] if _exists(os.path.join(folder, name)) else []
        yield from (os.path.join(folder, n) for n in names)


def glob_paths(pattern: str) -> list[str]:
    """`glob.glob(pattern, recursive=True)`, sorted; a folder it has to list and cannot is a `CodeParrotError`."""
    return sorted(p for p in _glob(pattern) if p)  # "" is `**`'s "this folder" at the top: glob leaves it out


def split_folders(folder: str | os.PathLike) -> dict[str, Path]:
    """{split: folder} of the `train/` and `valid/` subfolders of a preprocess output root (empty otherwise)."""
    folder = Path(folder)
    return {name: folder / name for name in SPLITS if os.path.isdir(folder / name)}  # False where unreadable


def split_files_for(spec: str | os.PathLike, split: str) -> list[Path] | None:
    """The data files of the `split` folder that goes with the folder `spec`: `spec/split` for a preprocess output
    root, the sibling `../split` when `spec` is another split folder (e.g. valid/ next to train/); None when there
    is no such folder or it holds no data files."""
    path = Path(spec).expanduser()
    if not path.is_dir():
        return None
    candidates = [path / split]
    if path.name in SPLITS and path.name != split:
        candidates.insert(0, path.parent / split)
    folder = next((c for c in candidates if c.is_dir()), None)
    return (_files_under(folder) or None) if folder is not None else None


def _folder_files(folder: Path, split: str | None, required: bool) -> list[Path]:
    splits = split_folders(folder)
    if splits:
        if split not in splits:
            first = next(iter(splits))
            raise CodeParrotError(f"{folder} is a preprocess output with subfolders {', '.join(splits)}: pass one "
                                  f"of them (e.g. {folder / first})")
        folder = splits[split]
    found = _files_under(folder)
    if not found and required:
        raise CodeParrotError(f"no input files ({', '.join(DATA_SUFFIXES)}) in {folder}")
    return found


def resolve_data_files(specs: str | os.PathLike | Iterable[str | os.PathLike], split: str | None = None) -> list[Path]:
    """Expand files, folders and globs (module docstring) into a de-duplicated file list: each spec's files
    sorted, specs in the order given. `split` ("train" or "valid"): what a preprocess output root stands for."""
    specs = [specs] if isinstance(specs, (str, os.PathLike)) else list(specs)
    if not specs:
        raise CodeParrotError("no input given (a file, folder or glob of .json/.jsonl(.gz) files)")
    files: list[Path] = []
    for spec in map(os.fspath, specs):
        path = Path(spec).expanduser()
        if path.is_dir():
            found = _folder_files(path, split, required=True)
        elif path.is_file() or path.is_fifo():
            found = [path]
        elif glob.has_magic(spec):
            found = []
            for match in map(Path, glob_paths(os.path.expanduser(spec))):
                if match.is_dir():
                    found.extend(_folder_files(match, split, required=False))
                elif is_data_file(match):
                    found.append(match)
            if not found:
                raise CodeParrotError(f"no input files match {spec} (looking for {', '.join(DATA_SUFFIXES)})")
        else:
            raise CodeParrotError(f"input not found: {spec} (the path does not exist)")
        for p in found:
            if not os.access(p, os.R_OK):
                raise CodeParrotError(f"input file is not readable: {p}")
        files.extend(found)
    return list(dict.fromkeys(files))  # a file named twice (folder + glob) is read once, first place kept
