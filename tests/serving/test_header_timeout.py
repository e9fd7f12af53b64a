"""--header-timeout: a connection that does not deliver a whole request head in time is closed (header_timeout.py).

uvicorn alone waits forever for a head: a silent socket or one trickling a byte every few seconds (slowloris) held
its connection and file descriptor indefinitely. Each test here would hang up to its socket timeout without the
deadline, and fails on it. Raw sockets on 127.0.0.1, every read bounded by a socket timeout."""

from __future__ import annotations

import http.client
import json
import socket
import time
from urllib.parse import urlsplit

import pytest

HEAD_TIMEOUT = 0.8  # seconds; every wait below is a few of these at most
MARGIN = 1.0  # how late a close may come on a busy 2-core machine
SLOW_HEAD = (b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: " + b"s" * 200 + b"\r\n\r\n")


@pytest.fixture(scope="module")
def server(serve_model):
    return serve_model("random", header_timeout=HEAD_TIMEOUT, body_timeout=5)


def connect(server) -> socket.socket:
    url = urlsplit(server.url)
    return socket.create_connection((url.hostname, url.port), timeout=HEAD_TIMEOUT + 2 * MARGIN)


def until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection; a socket timeout (the server kept it) fails."""
    received = b""
    try:
        while chunk := sock.recv(4096):
            received += chunk
    except TimeoutError:
        pytest.fail(f"the server kept the connection open (received {received!r})")
    return received


def trickle(sock: socket.socket, data: bytes, every: float = 0.2) -> tuple[bytes, int]:
    """Send `data` one byte per `every` seconds until the server closes the connection (at most 3 × the head
    timeout + margin, then fail); (what the server sent, how many bytes went out)."""
    received, sent = b"", 0
    sock.settimeout(every)
    give_up = time.monotonic() + 3 * HEAD_TIMEOUT + MARGIN
    while time.monotonic() < give_up:
        if sent < len(data):
            try:
                sock.sendall(data[sent:sent + 1])
            except (BrokenPipeError, ConnectionResetError):
                return received, sent
            sent += 1
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return received, sent
        if not chunk:
            return received, sent
        received += chunk
    pytest.fail(f"the server kept a trickling connection open ({sent} bytes sent over {3 * HEAD_TIMEOUT + MARGIN:g} s)")


def read_response(sock: socket.socket) -> tuple[int, bytes]:
    """(status, body) of one response with a Content-Length, read from a kept-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        assert chunk, f"closed mid-response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n") if line.lower().startswith(
        b"content-length:")))
    while len(body) < length:
        body += sock.recv(4096)
    return int(head.split(b" ", 2)[1]), body


def health(server) -> int:
    url = urlsplit(server.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    conn.request("GET", "/health")
    status = conn.getresponse().status
    conn.close()
    return status


def test_silent_connections_are_closed_and_others_are_served_meanwhile(server):
    start = time.monotonic()
    silent = [connect(server) for _ in range(20)]
    assert health(server) == 200  # the silent ones do not block a real client
    for sock in silent:
        assert until_closed(sock) == b""  # no byte of a request: closed without an answer
        sock.close()
    assert HEAD_TIMEOUT - 0.05 <= time.monotonic() - start <= HEAD_TIMEOUT + MARGIN


def test_a_slowloris_head_is_cut_at_the_deadline_however_steady_its_bytes(server):
    sock = connect(server)
    start = time.monotonic()
    received, sent = trickle(sock, SLOW_HEAD)
    elapsed = time.monotonic() - start
    sock.close()
    assert HEAD_TIMEOUT - 0.05 <= elapsed <= HEAD_TIMEOUT + MARGIN and sent < len(SLOW_HEAD)
    assert sent >= 3  # bytes kept coming, one per 0.2 s, and did not extend the deadline
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 ") and b"connection: close" in head.lower(), received
    assert b"--header-timeout" in body
    assert health(server) == 200


def test_a_kept_alive_connection_gets_the_deadline_again_after_each_answer(server):
    sock = connect(server)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_response(sock)[0] == 200
    start = time.monotonic()
    received, sent = trickle(sock, SLOW_HEAD)  # the next head, a byte at a time: uvicorn's keep-alive timer is off
    assert HEAD_TIMEOUT - 0.05 <= time.monotonic() - start <= HEAD_TIMEOUT + MARGIN and sent >= 3
    assert received.startswith(b"HTTP/1.1 408 "), received
    sock.close()
    idle = connect(server)  # an idle kept-alive connection: closed silently, before uvicorn's own 5 s
    idle.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_response(idle)[0] == 200
    start = time.monotonic()
    assert until_closed(idle) == b""
    assert time.monotonic() - start <= HEAD_TIMEOUT + MARGIN
    idle.close()


def test_slow_heads_within_the_deadline_and_slower_bodies_are_served(server):
    """The deadline covers the head only: a body slower than it is --body-timeout's business."""
    body = json.dumps({"inputs": "x", "parameters": {"max_new_tokens": 2}}).encode()
    head = (f"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
            "\r\n\r\n").encode()
    sock = connect(server)
    for piece in (head[:5], head[5:20], head[20:40], head[40:]):  # 0.3 s for the head
        sock.sendall(piece)
        time.sleep(0.1)
    time.sleep(HEAD_TIMEOUT)  # past the head deadline, had it still been armed
    sock.sendall(body)
    status, answer = read_response(sock)
    assert status == 200 and isinstance(json.loads(answer)["generated_text"], str), answer
    sock.sendall(b"GET /heal")  # the next request on the same connection, slow but in time
    time.sleep(HEAD_TIMEOUT / 2)
    sock.sendall(b"th HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_response(sock)[0] == 200
    sock.close()


def test_header_timeout_must_be_positive_and_uvicorn_must_have_the_hooks(monkeypatch):
    from uvicorn.protocols.http.h11_impl import H11Protocol

    from codeparrot.errors import CodeParrotError
    from codeparrot.serving.config import ServeConfig
    from codeparrot.serving.header_timeout import check_uvicorn_hooks

    for seconds in (0, -1, float("nan")):
        with pytest.raises(CodeParrotError, match="--header-timeout must be positive"):
            ServeConfig(model="m", header_timeout=seconds).validate()
    check_uvicorn_hooks.__wrapped__()  # this uvicorn has them
    monkeypatch.delattr(H11Protocol, "handle_events")  # a uvicorn that renamed it
    with pytest.raises(CodeParrotError, match=r"H11Protocol has no handle_events\(\)"):
        check_uvicorn_hooks.__wrapped__()
    monkeypatch.undo()
    monkeypatch.setattr(H11Protocol, "__init__", lambda self, **kwargs: None)  # one that stores `conn` elsewhere
    with pytest.raises(CodeParrotError, match="H11Protocol has no conn, transport, loop"):
        check_uvicorn_hooks.__wrapped__()
