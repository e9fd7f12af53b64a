"""Whether a bind address keeps a server (the app, the completion server) reachable from this machine only."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """True for `localhost` and loopback IPs (127.0.0.0/8, ::1); False for any other address or a host name, which
    may resolve to any interface."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
