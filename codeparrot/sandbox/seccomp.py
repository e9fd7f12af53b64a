"""The program's seccomp filter: an allowlist of the system calls a pure-Python program needs (stdlib + ctypes).

Measured, not guessed: the calls `strace -f` saw in an interpreter running the 164 canonical HumanEval
solutions with their tests, importing ~90 common standard-library modules, and using threads, a thread
pool, asyncio, temporary files and the clocks; plus the read-only siblings of those calls (pread/pwrite,
the *at forms, stat variants) and what glibc falls back to. tests/sandbox/ runs the canonical solutions,
a standard-library workload and every extension module's import under the filter. Everything on `ALLOWED`
passes; a few calls pass only with safe arguments (`RESTRICTED`, below); every other call, including ones
newer than this list, fails with ENOSYS (so libc falls back to an older call where it has one). So, among
others: memfd_create, memfd_secret, io_uring_*, add_key/request_key/keyctl, bpf, perf_event_open,
userfaultfd, ptrace, process_vm_*, pidfd_*, mount and every namespace call, socket() of any family, SysV
and POSIX IPC (shmget/shmat, msgget, semget, mq_open), personality, prctl, mlock, and every process spawn
unless `spawning`.

Arguments checked (the kernel hands the filter the low 32 bits of each argument, which is what we compare):
- `clone`: only a thread (CLONE_THREAD) and never a new namespace; with `spawning`, any clone without a
  namespace flag. `clone3` keeps its flags in memory the filter cannot read: ENOSYS, glibc falls back.
- `mmap` / `mprotect`: executable memory only as an unwritable mapping of a file (W^X: never anonymous,
  never writable, and mprotect never adds PROT_EXEC), with `exec_files`: used where every writable mount
  the program sees is noexec (the worker's read-only root), so the only files it can map to run are the
  interpreter's own read-only ones (a library it writes, builds in a memfd or finds under /dev cannot be
  run). Without `exec_files` (no read-only root: guard-only mode) no executable memory at all; the worker
  then loads every extension module of the interpreter before any program (`zygote.warm_up`).
- `socketpair`: AF_UNIX only (an unnamed pair: asyncio's self-pipe); `socket()` is refused for every family.
- `ioctl`: terminal queries and the fd flags only (TCGETS, TIOCGWINSZ, FIONREAD, FIONBIO, FIOCLEX, FIONCLEX).
- `fcntl`: duplicating, descriptor and status flags, the pipe size (`FCNTLS`); F_SETFL never with O_ASYNC.
  F_SETOWN/F_SETOWN_EX/F_SETSIG (with O_ASYNC: the kernel sends any signal to any process the program's
  uid may signal, whatever `kill` is allowed), F_SETLEASE, F_NOTIFY, F_SETPIPE_SZ, the seals and every
  lock command are refused. No locks at all (`flock` is off the list too): every worker's view holds the
  same inodes (the interpreter's files, the device nodes), so a lock one program takes is one another
  program can see, a channel between samples running side by side. A program that locks gets an errno.
- `futex`: any operation on process-private futexes (FUTEX_PRIVATE_FLAG, what glibc and CPython use);
  without the flag only waiting (FUTEX_WAIT, FUTEX_WAIT_BITSET: `pthread_join` waits on a shared futex the
  kernel wakes). A shared futex's key is (inode, offset) for a file mapping, the same in every worker:
  waking or requeueing on one would count another program's waiters.
- `madvise`: the advice values the allocators use and a few harmless others (`MADVICE`); not MADV_MERGEABLE
  (KSM would merge pages across workers: copy-on-write timing says which) nor MADV_COLD/MADV_PAGEOUT.
- `kill`, `tgkill`, `rt_(tg)sigqueueinfo` (with `foreign_signals`): only to the program's own pid;
  `prlimit64`: only of itself (pid 0 or its own).
Another ABI than the native one (x32, i386 through int 0x80) is refused outright.
"""

import ctypes
import os

# Native ABI: (AUDIT_ARCH, {syscall name: number}). x86_64 from asm/unistd_64.h; aarch64 from
# asm-generic/unistd.h (it has no open/stat/fork/... only their *at successors).
_X86_64 = {
    "read": 0, "write": 1, "open": 2, "close": 3, "stat": 4, "fstat": 5, "lstat": 6, "poll": 7, "lseek": 8,
    "mmap": 9, "mprotect": 10, "munmap": 11, "brk": 12, "rt_sigaction": 13, "rt_sigprocmask": 14,
    "rt_sigreturn": 15, "ioctl": 16, "pread64": 17, "pwrite64": 18, "readv": 19, "writev": 20, "access": 21,
    "pipe": 22, "select": 23, "sched_yield": 24, "mremap": 25, "madvise": 28, "dup": 32, "dup2": 33,
    "pause": 34, "nanosleep": 35, "getitimer": 36, "alarm": 37, "setitimer": 38, "getpid": 39, "sendfile": 40,
    "socket": 41, "sendto": 44, "recvfrom": 45, "sendmsg": 46, "recvmsg": 47, "shutdown": 48,
    "getsockname": 51, "getpeername": 52, "socketpair": 53, "setsockopt": 54, "getsockopt": 55, "clone": 56,
    "fork": 57, "vfork": 58, "execve": 59, "exit": 60, "wait4": 61, "kill": 62, "uname": 63, "fcntl": 72,
    "flock": 73, "fsync": 74, "fdatasync": 75, "truncate": 76, "ftruncate": 77, "getcwd": 79, "chdir": 80,
    "fchdir": 81, "rename": 82, "mkdir": 83, "rmdir": 84, "link": 86, "unlink": 87, "symlink": 88,
    "readlink": 89, "chmod": 90, "fchmod": 91, "umask": 95, "gettimeofday": 96, "getrlimit": 97,
    "getrusage": 98, "sysinfo": 99, "times": 100, "getuid": 102, "getgid": 104, "geteuid": 107, "getegid": 108,
    "getppid": 110, "getpgrp": 111, "getgroups": 115, "getresuid": 118, "getresgid": 120, "getpgid": 121,
    "getsid": 124, "rt_sigpending": 127, "arch_prctl": 158, "rt_sigtimedwait": 128, "rt_sigqueueinfo": 129, "rt_sigsuspend": 130,
    "sigaltstack": 131, "statfs": 137, "fstatfs": 138, "getpriority": 140, "sched_getparam": 143,
    "sched_getscheduler": 145, "setrlimit": 160, "gettid": 186, "time": 201, "futex": 202,
    "sched_getaffinity": 204, "epoll_create": 213, "getdents64": 217, "set_tid_address": 218,
    "clock_gettime": 228, "clock_getres": 229, "clock_nanosleep": 230, "exit_group": 231, "epoll_wait": 232,
    "epoll_ctl": 233, "tgkill": 234, "waitid": 247, "openat": 257, "mkdirat": 258, "newfstatat": 262,
    "unlinkat": 263, "renameat": 264, "linkat": 265, "symlinkat": 266, "readlinkat": 267, "fchmodat": 268,
    "faccessat": 269, "pselect6": 270, "ppoll": 271, "set_robust_list": 273, "get_robust_list": 274,
    "utimensat": 280, "epoll_pwait": 281, "eventfd": 284, "fallocate": 285, "eventfd2": 290,
    "epoll_create1": 291, "dup3": 292, "pipe2": 293, "preadv": 295, "pwritev": 296, "rt_tgsigqueueinfo": 297,
    "prlimit64": 302, "getcpu": 309, "renameat2": 316, "getrandom": 318, "execveat": 322,
    "copy_file_range": 326, "preadv2": 327, "pwritev2": 328, "statx": 332, "rseq": 334, "close_range": 436,
    "faccessat2": 439, "epoll_pwait2": 441,
}
_AARCH64 = {
    "getcwd": 17, "eventfd2": 19, "epoll_create1": 20, "epoll_ctl": 21, "epoll_pwait": 22, "dup": 23, "dup3": 24,
    "fcntl": 25, "ioctl": 29, "flock": 32, "mkdirat": 34, "unlinkat": 35, "symlinkat": 36, "linkat": 37,
    "renameat": 38, "statfs": 43, "fstatfs": 44, "truncate": 45, "ftruncate": 46, "fallocate": 47,
    "faccessat": 48, "chdir": 49, "fchdir": 50, "fchmod": 52, "fchmodat": 53, "openat": 56, "close": 57,
    "pipe2": 59, "getdents64": 61, "lseek": 62, "read": 63, "write": 64, "readv": 65, "writev": 66,
    "pread64": 67, "pwrite64": 68, "preadv": 69, "pwritev": 70, "sendfile": 71, "pselect6": 72, "ppoll": 73,
    "readlinkat": 78, "newfstatat": 79, "fstat": 80, "fsync": 82, "fdatasync": 83, "utimensat": 88,
    "exit": 93, "exit_group": 94, "waitid": 95, "set_tid_address": 96, "futex": 98, "set_robust_list": 99,
    "get_robust_list": 100, "nanosleep": 101, "getitimer": 102, "setitimer": 103, "clock_gettime": 113,
    "clock_getres": 114, "clock_nanosleep": 115, "sched_getscheduler": 120, "sched_getparam": 121,
    "sched_getaffinity": 123, "sched_yield": 124, "kill": 129, "tgkill": 131, "sigaltstack": 132,
    "rt_sigsuspend": 133, "rt_sigaction": 134, "rt_sigprocmask": 135, "rt_sigpending": 136,
    "rt_sigtimedwait": 137, "rt_sigqueueinfo": 138, "rt_sigreturn": 139, "getpriority": 141, "times": 153,
    "getpgid": 155, "getsid": 156, "getgroups": 158, "uname": 160, "getrlimit": 163, "setrlimit": 164,
    "getrusage": 165, "umask": 166, "getcpu": 168, "gettimeofday": 169, "getpid": 172, "getppid": 173,
    "getuid": 174, "geteuid": 175, "getgid": 176, "getegid": 177, "gettid": 178, "sysinfo": 179,
    "socket": 198, "socketpair": 199, "getsockname": 204, "getpeername": 205, "sendto": 206, "recvfrom": 207,
    "setsockopt": 208, "getsockopt": 209, "shutdown": 210, "sendmsg": 211, "recvmsg": 212, "brk": 214,
    "munmap": 215, "mremap": 216, "clone": 220, "execve": 221, "mmap": 222, "mprotect": 226, "madvise": 233,
    "rt_tgsigqueueinfo": 240, "wait4": 260, "prlimit64": 261, "renameat2": 276, "getrandom": 278,
    "execveat": 281, "copy_file_range": 285, "preadv2": 286, "pwritev2": 287, "statx": 291, "rseq": 293,
    "close_range": 436, "faccessat2": 439, "epoll_pwait2": 441, "getresuid": 148, "getresgid": 150,
}
ARCHES = {"x86_64": (0xC000003E, _X86_64), "aarch64": (0xC00000B7, _AARCH64)}

# Allowed whatever the arguments (names missing on an architecture are skipped there).
ALLOWED = frozenset({
    # files and folders (the mounts decide what is visible and writable)
    "read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev", "preadv2", "pwritev2",
    "open", "openat", "close", "close_range", "stat", "fstat", "lstat", "newfstatat", "statx", "lseek",
    "access", "faccessat", "faccessat2", "readlink", "readlinkat", "getcwd", "chdir", "fchdir", "getdents64",
    "mkdir", "mkdirat", "rmdir", "unlink", "unlinkat", "rename", "renameat", "renameat2", "link", "linkat",
    "symlink", "symlinkat", "chmod", "fchmod", "fchmodat", "truncate", "ftruncate", "fsync", "fdatasync",
    "utimensat", "umask", "statfs", "fstatfs", "fallocate", "sendfile", "copy_file_range",
    "dup", "dup2", "dup3", "pipe", "pipe2",
    # memory (mmap/mprotect/madvise: restricted)
    "munmap", "mremap", "brk",
    # signals to itself, timers, clocks
    "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "sigaltstack", "rt_sigpending", "rt_sigsuspend",
    "rt_sigtimedwait", "pause", "alarm", "setitimer", "getitimer", "clock_gettime", "clock_getres",
    "clock_nanosleep", "nanosleep", "gettimeofday", "time", "times", "getrusage", "uname",
    "getrandom",
    # identity (read only)
    "getpid", "gettid", "getppid", "getuid", "geteuid", "getgid", "getegid", "getgroups", "getresuid",
    "getresgid", "getpgrp", "getpgid", "getsid", "getpriority", "sched_getparam", "sched_getscheduler",
    "sched_getaffinity", "getcpu", "getrlimit", "setrlimit",
    # threads
    "set_robust_list", "get_robust_list", "rseq", "set_tid_address", "sched_yield", "exit",
    "exit_group",
    # waiting on descriptors; an unnamed socket pair's traffic
    "poll", "ppoll", "select", "pselect6", "epoll_create", "epoll_create1", "epoll_ctl", "epoll_wait",
    "epoll_pwait", "epoll_pwait2", "eventfd", "eventfd2", "getsockname", "getpeername", "getsockopt",
    "setsockopt", "sendto", "recvfrom", "sendmsg", "recvmsg", "shutdown",
})
# Only with `spawning` (arch_prctl: a freshly exec'd loader sets up thread-local storage with it).
SPAWNING = frozenset({"fork", "vfork", "execve", "execveat", "wait4", "waitid", "arch_prctl"})
SIGNALS = ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")
CLONE_THREAD, CLONE_NAMESPACES = 0x00010000, 0x7E020080  # NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET|NEWTIME
PROT_WRITE, PROT_EXEC, MAP_ANONYMOUS, AF_UNIX = 2, 4, 0x20, 1
IOCTLS = (0x5401, 0x5413, 0x541B, 0x5421, 0x5450, 0x5451)  # TCGETS TIOCGWINSZ FIONREAD FIONBIO FIONCLEX FIOCLEX
# fcntl commands a program may use: F_DUPFD, F_GETFD, F_SETFD, F_GETFL, F_SETFL (never O_ASYNC),
# F_DUPFD_CLOEXEC, F_GETPIPE_SZ. Not F_SETOWN(_EX), F_SETSIG, F_SETLEASE, F_NOTIFY (each makes the kernel send
# a chosen signal to a chosen process: a kill by proxy), nor the record and OFD locks (F_GETLK 5, F_SETLK 6,
# F_SETLKW 7, F_OFD_* 36-38: a lock on a file of the shared view is seen by every worker).
FCNTLS = (0, 1, 2, 3, 1030, 1032)
FUTEX_PRIVATE_FLAG = 128
FUTEX_SHARED_WAITS = (0, 9, 256, 265)  # FUTEX_WAIT, FUTEX_WAIT_BITSET, each also with FUTEX_CLOCK_REALTIME
# madvise advice a program may give: NORMAL, RANDOM, SEQUENTIAL, WILLNEED, DONTNEED, FREE, DONTFORK, DOFORK,
# HUGEPAGE, NOHUGEPAGE, DONTDUMP, DODUMP, WIPEONFORK, KEEPONFORK, POPULATE_READ, POPULATE_WRITE.
MADVICE = (0, 1, 2, 3, 4, 8, 10, 11, 14, 15, 16, 17, 18, 19, 22, 23)
F_SETFL, O_ASYNC = 4, 0o20000  # the same on x86_64 and aarch64
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2

_LD, _JEQ, _JGE, _JSET, _JA, _RET = 0x20, 0x15, 0x35, 0x45, 0x05, 0x06  # BPF_LD|W|ABS, JMP|JEQ|K, JGE, JSET, JA, RET
ALLOW, EPERM, ENOSYS = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38  # SECCOMP_RET_ALLOW, RET_ERRNO | errno
_NR, _ARCH = 0, 4


# Calls allowed only with one argument among a list: name -> (argument index, allowed values).
ONE_OF = {"ioctl": (1, IOCTLS), "madvise": (2, MADVICE)}


def _arg(i: int) -> int:
    return 16 + 8 * i  # low 32 bits of argument i (little-endian)


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


class _Program:
    """A tiny BPF assembler: conditional jumps name labels (resolved, at most 255 ahead), `ja` may go far."""

    def __init__(self):
        self.code, self.labels = [], {}

    def emit(self, op, k=0, jt=None, jf=None):
        self.code.append([op, jt, jf, k])

    def label(self, name):
        self.labels[name] = len(self.code)

    def assemble(self):
        out = []
        for pc, (op, jt, jf, k) in enumerate(self.code):
            def rel(target):
                if target is None:
                    return 0
                offset = self.labels[target] - pc - 1
                if not 0 <= offset <= 255:
                    raise OSError(f"seccomp filter: jump of {offset} at {pc}")
                return offset
            if op == _JA:
                out.append((op, 0, 0, self.labels[k] - pc - 1))
            else:
                out.append((op, rel(jt), rel(jf), k))
        return out


def _search(p: _Program, entries: list, name: str) -> None:
    """Emit a search of the loaded syscall number among `entries` ((number, label), sorted): a match jumps
    to its label, anything else to "enosys". Every jump is `ja` (any distance) or skips one instruction."""
    if len(entries) <= 3:
        for number, label in entries:
            p.emit(_JEQ, number, jt=None, jf=f"{name}_{number}")
            p.emit(_JA, label)
            p.label(f"{name}_{number}")
        p.emit(_JA, "enosys")
        return
    middle = len(entries) // 2
    p.emit(_JGE, entries[middle][0], jt=None, jf=f"{name}_left")
    p.emit(_JA, f"{name}_right")
    p.label(f"{name}_left")
    _search(p, entries[:middle], name + "l")
    p.label(f"{name}_right")
    _search(p, entries[middle:], name + "r")


def build(pid: int, foreign_signals: bool, spawning: bool, exec_files: bool, machine: str | None = None):
    """The filter (a `sock_fprog`): see the module docstring. `pid`: the program's own pid as it sees it
    (for the signal rule; 0 when `foreign_signals` is off). `spawning` needs `exec_files` (an exec'd
    interpreter's loader maps its libraries)."""
    machine = machine or os.uname().machine
    if machine not in ARCHES:
        raise OSError(f"seccomp filter: no syscall table for {machine}")
    arch, numbers = ARCHES[machine]
    p = _Program()
    p.emit(_LD, _ARCH)
    p.emit(_JEQ, arch, jt="native")
    p.emit(_RET, EPERM)
    p.label("native")
    p.emit(_LD, _NR)
    if machine == "x86_64":
        p.emit(_JGE, 0x40000000, jf="native_nr")  # the x32 ABI's numbers
        p.emit(_RET, EPERM)
        p.label("native_nr")
    plain = sorted(numbers[n] for n in ALLOWED | (SPAWNING if spawning else frozenset()) if n in numbers)
    restricted = [("mmap", "mmap"), ("mprotect", "noexec"), ("clone", "clone"), ("socketpair", "socketpair"),
                  ("ioctl", "one_of"), ("fcntl", "fcntl"), ("prlimit64", "self_or_zero"), ("futex", "futex"),
                  ("madvise", "one_of")]
    restricted += [(n, "self" if foreign_signals else "allow") for n in SIGNALS]
    # A binary search over the syscall numbers (about 8 comparisons whichever the call): the kernel runs the
    # filter on restricted calls, and at install time for every number (its cache of always-allowed
    # calls), so a linear list of ~170 comparisons costs each program a fraction of a millisecond.
    targets = {number: "allow" for number in plain}
    targets.update({numbers[name]: f"block_{name}" for name, _ in restricted})
    _search(p, sorted(targets.items()), "t")
    kinds = dict(restricted)
    for name, kind in kinds.items():
        p.label(f"block_{name}")
        if kind == "allow":
            p.emit(_JA, "allow")
        elif kind == "mmap" and (exec_files or spawning):  # W^X, from a file only
            p.emit(_LD, _arg(2))
            p.emit(_JSET, PROT_EXEC, jf="allow")
            p.emit(_JSET, PROT_WRITE, jt="eperm")
            p.emit(_LD, _arg(3))
            p.emit(_JSET, MAP_ANONYMOUS, jt="eperm", jf="allow")
        elif kind in ("mmap", "noexec"):  # no new executable memory
            p.emit(_LD, _arg(2))
            p.emit(_JSET, PROT_EXEC, jt="eperm", jf="allow")
        elif kind == "clone":
            p.emit(_LD, _arg(0))
            p.emit(_JSET, CLONE_NAMESPACES, jt="eperm")
            if spawning:
                p.emit(_JA, "allow")
            else:
                p.emit(_JSET, CLONE_THREAD, jt="allow", jf="eperm")
        elif kind == "socketpair":
            p.emit(_LD, _arg(0))
            p.emit(_JEQ, AF_UNIX, jt="allow", jf="eperm")
        elif kind == "one_of":  # the call's argument is one of a list (ONE_OF)
            index, values = ONE_OF[name]
            p.emit(_LD, _arg(index))
            for value in values:
                p.emit(_JEQ, value, jt="allow")
            p.emit(_JA, "eperm")
        elif kind == "fcntl":
            p.emit(_LD, _arg(1))
            for command in FCNTLS:
                p.emit(_JEQ, command, jt="allow")
            p.emit(_JEQ, F_SETFL, jf="eperm")
            p.emit(_LD, _arg(2))
            p.emit(_JSET, O_ASYNC, jt="eperm", jf="allow")
        elif kind == "futex":
            p.emit(_LD, _arg(1))
            p.emit(_JSET, FUTEX_PRIVATE_FLAG, jt="allow")
            for op in FUTEX_SHARED_WAITS:
                p.emit(_JEQ, op, jt="allow")
            p.emit(_JA, "eperm")
        elif kind == "self":
            p.emit(_LD, _arg(0))
            p.emit(_JEQ, pid & 0xFFFFFFFF, jt="allow", jf="eperm")
        elif kind == "self_or_zero":
            p.emit(_LD, _arg(0))
            p.emit(_JEQ, 0, jt="allow")
            p.emit(_JEQ, pid & 0xFFFFFFFF, jt="allow", jf="eperm")
    p.label("enosys")  # the returns last: every block's conditional jumps reach them going forward
    p.emit(_RET, ENOSYS)
    p.label("eperm")
    p.emit(_RET, EPERM)
    p.label("allow")
    p.emit(_RET, ALLOW)
    code = p.assemble()
    filters = (_SockFilter * len(code))(*[_SockFilter(*ins) for ins in code])
    return _SockFprog(len(code), filters)  # keeps `filters` alive (ctypes records the pointer's target)


def install(fprog, libc) -> None:
    """Install `fprog` on the calling thread (PR_SET_NO_NEW_PRIVS must be set); inherited by children."""
    if libc.prctl(ctypes.c_int(PR_SET_SECCOMP), ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(fprog),
                  ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"seccomp filter: {os.strerror(err)}")
