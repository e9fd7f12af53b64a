"""The one-line summary of a sandbox worker's active layers (`describe_layers`), for logs and results.json."""


def describe_layers(layers: dict) -> str:
    """One line naming the active layers, for logs and results.json."""
    parts = ["own process + session", "rlimits (cpu, memory, file size, open files)", "empty environment"]
    if layers.get("pid_namespace"):
        parts.append("PID namespace (whole tree killed on timeout)")
    else:
        parts.append("process-group kill on timeout (no PID namespace)")
    if layers.get("uid") is not None:
        parts.append(f"private uid {layers['uid']} + RLIMIT_NPROC")
    if layers.get("user_namespace"):
        parts.append("user namespace, capabilities dropped")
    if layers.get("network_namespace"):
        parts.append("network namespace (no network)")
    view = layers.get("minimal_root")
    if view:
        parts.append(f"minimal filesystem view (interpreter, stdlib and {view['files']} shared libraries read-only, "
                     "a tmpfs workspace; no other host path)")
    elif layers.get("readonly_root"):
        parts.append("read-only filesystem except a " + ("tmpfs " if layers.get("workspace_tmpfs") else "")
                     + "workspace")
    if layers.get("hidden_homes") and not view:
        parts.append("home folders hidden (" + ", ".join(layers["hidden_homes"]) + ")")
    if layers.get("ipc_namespace"):
        parts.append("IPC namespace per program (SysV/POSIX IPC dies with it)")
    if layers.get("fresh_proc"):
        parts.append("own /proc per program (host processes invisible" + (", process folders only"
                     if layers.get("proc_options") else "") + ") + per-program tmpfs workspace")
    if layers.get("memory_cgroup"):
        parts.append(f"memory cgroup {layers['memory_cgroup']} per worker (everything a program and its checker "
                     "hold: heap, tmpfs, shared memory, kernel buffers)")
    else:
        parts.append("no memory cgroup (memory bounded by the address-space limit and the syscall allowlist)")
    if layers.get("program_seccomp"):
        parts.append("seccomp syscall allowlist (no executable memory, no sockets, no IPC, memfd, io_uring, keys, "
                     "file locks, shared futex wakes" + (")" if layers.get("spawning") else ", no process spawning)"))
    if layers.get("seccomp"):
        parts.append("seccomp: no signals to other processes")
    parts.append("audit-hook guard" if layers.get("guard") else "audit hook: verdict integrity only")
    key = layers.get("answer_key") or {}
    if key.get("reachable"):
        parts.append(f"ANSWER KEY READABLE BY PROGRAMS ({key['reachable']})")
    elif key.get("paths"):
        count, by = len(key["paths"]), " and the ".join(key["hidden_by"])
        parts.append(f"answer key ({count} host path{'s' * (count != 1)}) hidden by the {by}")
    return "; ".join(parts)
