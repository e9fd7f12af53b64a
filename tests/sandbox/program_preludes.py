"""Lines the sandbox tests' child interpreters start with (Python source, joined in front of a case's own):
the set-up that several test modules need before they build a Sandbox."""

from __future__ import annotations

import textwrap

# A program's first lines for the tests that mount (after `import ctypes, json, os, sys`): its own mount
# namespace, nothing propagating to the host's (or a JSON skip line saying why it cannot).
PRIVATE_MOUNTS = r'''
libc = ctypes.CDLL(None, use_errno=True)
def ok(ret, what):
    if ret != 0:
        print(json.dumps({"skip": what + ": " + os.strerror(ctypes.get_errno())})); sys.exit()
ok(libc.unshare(0x00020000), "no mount namespace")
ok(libc.mount(None, b"/", None, (1 << 14) | (1 << 18), None), "mount --make-rprivate /")
'''

# As root, become an unprivileged uid first (in a mount namespace of our own where the interpreter stays
# reachable when it lives under a 0700 home such as /root): the Sandbox then takes its unprivileged path, a
# user namespace with the harness's uid, as on a machine where we are not root.
AS_UNPRIVILEGED = r'''
import ctypes, json, os, sys
UNPRIVILEGED = 1999999937
if os.geteuid() == 0:''' + textwrap.indent(PRIVATE_MOUNTS, "    ") + r'''
    path, blocked = os.path.realpath(sys.base_prefix), None
    while path != "/":
        if not os.stat(path).st_mode & 0o001:
            blocked = path  # the outermost folder the unprivileged uid could not cross
        path = os.path.dirname(path)
    if blocked is not None:  # cover it with a traversable tmpfs, the interpreter's folder bound back
        inner = os.path.realpath(sys.base_prefix)
        fd = os.open(inner, os.O_PATH | os.O_DIRECTORY)
        ok(libc.mount(b"tmpfs", blocked.encode(), b"tmpfs", 0, b"mode=0755"), "tmpfs over " + blocked)
        os.makedirs(inner, mode=0o755)
        ok(libc.mount(("/proc/self/fd/%d" % fd).encode(), inner.encode(), None, 4096 | (1 << 14), None), "bind")
    os.setgroups([])
    os.setresgid(UNPRIVILEGED, UNPRIVILEGED, UNPRIVILEGED)
    os.setresuid(UNPRIVILEGED, UNPRIVILEGED, UNPRIVILEGED)
'''
