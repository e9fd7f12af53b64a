"""The trusted checker inside a bound (issue 29, attack 4): it runs in the worker's memory cgroup, so its
memory counts in the same `memory_mb` as the program's, and a reply is decoded only within
`channel.MAX_FRAME` bytes and `channel.MAX_VALUES` values, so what a reply can cost it is small and known.

Before: the checker sat outside the cgroup (bounded only by its own address-space limit, another
`memory_mb`), and a 16 MiB reply of empty lists became 0.5-0.7 GiB there.
"""

from __future__ import annotations

import os
import threading
import time
import tracemalloc

import pytest

from codeparrot.sandbox import Program, SandboxConfig, channel

M = channel.MAX_VALUES
REPLY_MIB = 64  # what decoding one reply may cost the checker at most (measured below: about 48 MiB)
CHECK = "def check(candidate):\n    assert candidate(2) == 4\n"


def _frames() -> dict:
    """The largest replies the channel accepts, in values and in bytes, and the smallest it refuses."""
    frames = {
        "most values (empty lists)": b'{"ok":[' + b"[]," * (M // 2 - 3) + b'[]]}',
        "most values (strings)": b'{"ok":[' + b",".join(b'"%d"' % i for i in range(M - 5)) + b"]}",
        "most values (tagged sets)": b'{"ok":[' + b'{"s":[]},' * (M // 4 - 3) + b'{"s":[]}]}',
        "most bytes (one string)": b'{"ok":"' + b"x" * (channel.MAX_FRAME - 16) + b'"}',
        "one value too many": b'{"ok":[' + b"[]," * (M // 2 - 2) + b'[]]}',
        "16 MiB of empty lists": b'{"ok":[' + b"[]," * ((channel.MAX_FRAME - 16) // 3) + b'[]]}',
    }
    for name, frame in frames.items():
        assert len(frame) <= channel.MAX_FRAME, name
        assert (channel.values_in(frame) <= M) == ("most" in name), (name, channel.values_in(frame))
    return frames


def test_decoding_the_largest_reply_costs_the_checker_little():
    """What receiving and decoding a reply allocates (tracemalloc peak, in this process), for the largest
    replies the channel accepts (the costliest per value, strings, and the longest); larger ones are refused
    before they are parsed."""
    for name, frame in _frames().items():
        if name in ("most values (empty lists)", "most values (tagged sets)"):  # cheaper per value than strings
            continue
        read, write = os.pipe()
        sender = threading.Thread(target=lambda: (channel.send(write, frame), os.close(write)))
        tracemalloc.start()
        try:
            sender.start()
            data = channel.receive(read)
            try:
                channel.decode(channel.loads(data)["ok"])
                refused = False
            except channel.TooLarge:
                refused = True
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
            sender.join()
            os.close(read)
        assert refused == ("most" not in name), name
        assert peak < REPLY_MIB << 20, (name, peak >> 20)


# Builds the frame in the program (the large ones would not fit its text) and writes it straight to the reply
# pipe (fd 7), as an attacker who read channel.py would.
BUILDS = {
    "most values (empty lists)": "b'{\"ok\":[' + b'[],' * (M // 2 - 3) + b'[]]}'",
    "most values (strings)": "b'{\"ok\":[' + b','.join(b'\"%d\"' % i for i in range(M - 5)) + b']}'",
    "most values (tagged sets)": "b'{\"ok\":[' + b'{\"s\":[]},' * (M // 4 - 3) + b'{\"s\":[]}]}'",
    "most bytes (one string)": "b'{\"ok\":\"' + b'x' * (FRAME - 16) + b'\"}'",
    "one value too many": "b'{\"ok\":[' + b'[],' * (M // 2 - 2) + b'[]]}'",
    "16 MiB of empty lists": "b'{\"ok\":[' + b'[],' * ((FRAME - 16) // 3) + b'[]]}'",
}
RAW_REPLY = ("import os\nM, FRAME = {values}, {frame}\ndef f(x):\n    data = {build}\n"
             "    data = len(data).to_bytes(8, 'little') + data\n    while data:\n"
             "        data = data[os.write(7, data):]\n    os._exit(0)\n")


def _raw_reply_program(name: str) -> Program:
    return Program("", RAW_REPLY.format(values=M, frame=channel.MAX_FRAME, build=BUILDS[name]), CHECK, "f")


def test_the_checker_runs_in_the_worker_s_cgroup_and_every_reply_gets_a_verdict(start_box):
    """With memory_mb = 256 for everything a job holds (program and checker), each of the largest replies
    is checked (a failed assertion: it was decoded and compared) and each larger one refused (that call's
    failure); none ends in a memory kill. During a call the checker is one of the cgroup's processes, as
    is the worker that forks it."""
    box = start_box(SandboxConfig(timeout=10.0, memory_mb=256), workers=1)
    group = box.memory_groups[0]
    if group is None or group[0] is None:
        pytest.skip(f"no memory cgroup here: {box.layers['notes']}")
    frames = _frames()
    for name, frame in frames.items():  # the programs build exactly these frames
        assert eval(BUILDS[name], {"M": M, "FRAME": channel.MAX_FRAME}) == frame, name
    results = dict(zip(frames, box.run([_raw_reply_program(name) for name in frames])))
    for name, result in results.items():
        assert result.status == "failed", (name, result)
        if "most" in name:
            assert result.detail == "AssertionError: assert candidate(2) == 4", (name, result)
        else:
            assert "more than the checker decodes" in result.detail, (name, result)

    # The checker, forked by the worker (the server), is in the group beside the zygote while it calls.
    seen, done = [], threading.Event()

    def watch():
        server = box._servers[0].proc.pid
        while not done.is_set():
            with open(os.path.join(group[0], "cgroup.procs")) as procs:
                pids = [int(line) for line in procs if line.strip()]
            children = []
            for pid in pids:
                try:
                    with open(f"/proc/{pid}/stat") as stat:
                        if int(stat.read().rsplit(")", 1)[1].split()[1]) == server:
                            children.append(pid)
                except OSError:
                    pass
            seen.append((server in pids, len(children)))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        slow = box.run([Program("", "import time\ndef f(x):\n    time.sleep(1.0)\n    return x * x\n", CHECK, "f")])
    finally:
        done.set()
        watcher.join()
    assert slow[0].passed, slow
    assert max(seen) == (True, 2), seen  # the worker, its zygote and the checker (before: the zygote only)
