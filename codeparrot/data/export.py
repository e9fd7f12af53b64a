"""Export local source trees in exactly the format of CodeParrot's BigQuery GitHub export.

Each record is one JSON line with the fields and field order of the BigQuery export:
`repo_name, path, copies, size, content, license`. BigQuery writes INT64 columns as JSON strings in its
JSON exports (to keep 64-bit precision), so `copies` and `size` are strings here too ("1", "2048"): a
pipeline that reads this export reads the real one. Values:
- `repo_name`: the source tree's folder name (with `repo_per_subfolder`, each top-level subfolder of the tree
  is its own repository, e.g. every package of a site-packages folder);
- `path`: the file's path relative to the repository folder, with "/" separators;
- `copies` "1", `license` "unknown", `size` the file's size in bytes, `content` its text.

Selection as the BigQuery query: files ending in `.py` with 1,024 <= size < 1,048,576 bytes. Files that
cannot be read, are not UTF-8 or whose name (or repository folder's name) is not UTF-8 are skipped and counted;
symbolic links, hidden folders (.git, .venv) and `site-packages`/`dist-packages` folders below a tree's root
(third-party code inside an interpreter's lib folder) are not followed. Order is deterministic: folders are
walked in sorted order.

With no source tree given, the running interpreter's standard library is exported (about 1,450 files on
CPython 3.11): the project's embedded default corpus.
"""

from __future__ import annotations

import json
import os
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from tqdm import tqdm

from codeparrot.atomic_io import atomic_dir
from codeparrot.config import REQUIRED, doc
from codeparrot.data.shards import ShardWriter, ensure_replaceable
from codeparrot.errors import CodeParrotError

MIN_SIZE = 1024
MAX_SIZE = 1048576  # exclusive
_SKIPPED_DIRS = {"site-packages", "dist-packages", "__pycache__"}


def default_source() -> Path:
    """The running interpreter's standard library folder."""
    return Path(sysconfig.get_paths()["stdlib"])


@dataclass
class SourceFile:
    repo_name: str
    path: str  # relative to the repository folder, "/"-separated
    abs_path: Path
    size: int


@dataclass
class ExportStats:
    files_written: int = 0
    bytes_written: int = 0  # content bytes
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count
    first_skipped: dict[str, str] = field(default_factory=dict)  # reason -> the first path skipped for it
    shards: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def skip(self, reason: str, path: str | os.PathLike) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        self.first_skipped.setdefault(reason, os.fsdecode(path))


def _walk(root: Path, stats: ExportStats, suffix: str) -> Iterator[tuple[Path, int]]:
    """(file, size) of every regular `suffix` file below `root`, depth first, entries in sorted order."""
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError:
        stats.skip("unreadable folder", root)
        return
    subdirs = []
    for entry in entries:
        if entry.name.startswith("."):
            continue
        try:
            if entry.is_symlink():
                continue
            if entry.is_dir():
                if entry.name not in _SKIPPED_DIRS:
                    subdirs.append(entry)
            elif entry.is_file() and entry.name.endswith(suffix):
                yield Path(entry.path), entry.stat().st_size
        except OSError:
            stats.skip("unreadable file", entry.path)
    for entry in subdirs:
        yield from _walk(Path(entry.path), stats, suffix)


def find_source_files(src_dirs: list[Path], stats: ExportStats, suffix: str = ".py", min_size: int = MIN_SIZE,
                      max_size: int = MAX_SIZE, repo_per_subfolder: bool = False) -> list[SourceFile]:
    """The files to export, in export order (trees in the order given, each walked in sorted order)."""
    files: list[SourceFile] = []
    for src in src_dirs:
        if not src.exists():
            raise CodeParrotError(f"source folder not found: {src}")
        if not src.is_dir():
            raise CodeParrotError(f"not a folder: {src} (export_local takes source trees)")
        src = src.resolve()
        for path, size in _walk(src, stats, suffix):
            if not min_size <= size < max_size:
                stats.skip("outside size window", path)
                continue
            rel = path.relative_to(src)
            if repo_per_subfolder and len(rel.parts) > 1:
                repo, rel = rel.parts[0], Path(*rel.parts[1:])
            else:
                repo = src.name
            files.append(SourceFile(repo, rel.as_posix(), path, size))
    return files


def export_local(src_dirs: list[str | os.PathLike] | None, output_dir: str | os.PathLike,
                 samples_per_file: int = 100_000, suffix: str = ".py", min_size: int = MIN_SIZE,
                 max_size: int = MAX_SIZE, repo_per_subfolder: bool = False, compresslevel: int = 6,
                 progress: bool | None = None) -> ExportStats:
    """Write the source trees (default: the standard library) as sharded gzip JSONL into `output_dir`,
    atomically (a failed or interrupted export leaves no `output_dir`)."""
    start = time.perf_counter()
    stats = ExportStats()
    roots = [Path(p).expanduser() for p in src_dirs] if src_dirs else [default_source()]
    ensure_replaceable(output_dir, ["file-*.json.gz"], "an export shard")
    files = find_source_files(roots, stats, suffix, min_size, max_size, repo_per_subfolder)
    if not files:
        raise CodeParrotError(f"no {suffix} files of {min_size} <= size < {max_size} bytes under "
                              f"{', '.join(map(str, roots))}")
    with atomic_dir(output_dir) as tmp:
        with ShardWriter(tmp, samples_per_file, compresslevel) as writer:
            _write_files(files, writer, stats, start, progress, min_size, max_size)
            if stats.files_written == 0:
                raise CodeParrotError(f"no readable UTF-8 {suffix} files under {', '.join(map(str, roots))}")
            paths = writer.close()
    stats.shards = [str(Path(output_dir) / p.name) for p in paths]
    stats.seconds = time.perf_counter() - start
    return stats


def _write_files(files: list[SourceFile], writer: ShardWriter, stats: ExportStats, start: float,
                 progress: bool | None, min_size: int, max_size: int) -> None:

    bar = tqdm(files, unit=" files", desc="export", disable=None if progress is None else not progress)
    for source in bar:
        try:
            data = source.abs_path.read_bytes()
        except OSError:
            stats.skip("unreadable file", source.abs_path)
            continue
        try:
            content = data.decode("utf-8")
        except UnicodeDecodeError:
            stats.skip("not UTF-8", source.abs_path)
            continue
        if not min_size <= len(data) < max_size:  # changed since it was listed
            stats.skip("outside size window", source.abs_path)
            continue
        record = {"repo_name": source.repo_name, "path": source.path, "copies": "1", "size": str(len(data)),
                  "content": content, "license": "unknown"}
        try:
            line = json.dumps(record, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:  # a folder or file name that is not UTF-8 (its bytes are surrogates in a str)
            stats.skip("name not UTF-8", source.abs_path)
            continue
        writer.write_line(line)
        stats.files_written += 1
        stats.bytes_written += len(data)
        if stats.files_written % 256 == 0:
            bar.set_postfix_str(f"{stats.bytes_written / 1e6 / max(time.perf_counter() - start, 1e-9):.1f} MB/s")
    bar.close()


@dataclass
class ExportConfig:
    """scripts/export_local.py: which source trees become a BigQuery-format export, and its shard layout."""

    output_dir: str = doc(REQUIRED, "folder for the gzip JSONL shards (replaced atomically)")
    src_dirs: list[str] = doc([], "source trees to export; each is one repository named after its folder "
                                  f"(default: the standard library, {default_source()})",
                              flag="src_dirs", nargs="*", metavar="SRC_DIR")
    samples_per_file: int = doc(100_000, "records per shard")
    extension: str = doc(".py", "file name suffix to export")
    min_size: int = doc(MIN_SIZE, "smallest file in bytes")
    max_size: int = doc(MAX_SIZE, "files must be smaller than this many bytes")
    repo_per_subfolder: bool = doc(False, "treat each top-level subfolder of a SRC_DIR as its own repository (e.g. "
                                          "the packages of a site-packages folder, or a folder of cloned "
                                          "repositories)")
    compression_level: int = doc(6, "gzip level 0-9 of the shards")
    progress: bool | None = doc(None, "no progress bar", flag="--no-progress", inverted=True)


def run_export(cfg: ExportConfig) -> ExportStats:
    """scripts/export_local.py: `export_local` with `cfg`, then a summary line and the skip counts."""
    stats = export_local(cfg.src_dirs or None, cfg.output_dir, samples_per_file=cfg.samples_per_file,
                         suffix=cfg.extension, min_size=cfg.min_size, max_size=cfg.max_size,
                         repo_per_subfolder=cfg.repo_per_subfolder, compresslevel=cfg.compression_level,
                         progress=cfg.progress)
    rate = stats.files_written / max(stats.seconds, 1e-9)
    print(f"exported {stats.files_written} files ({stats.bytes_written / 1e6:.1f} MB) into {len(stats.shards)} "
          f"shard(s) under {cfg.output_dir} in {stats.seconds:.1f}s ({rate:.0f} files/s)")
    for reason, count in sorted(stats.skipped.items()):
        print(f"  skipped {count} ({reason}; first: {stats.first_skipped[reason]!r})")
    return stats
