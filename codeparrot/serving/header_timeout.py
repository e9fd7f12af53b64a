"""A deadline on each request's head (request line and headers), which uvicorn does not have.

The gap, in uvicorn 0.54's h11 protocol (`uvicorn.protocols.http.h11_impl.H11Protocol`): its only timer is
`timeout_keep_alive`, armed when a response completes and cancelled by `data_received` on any byte. Nothing runs
while a connection's first request head is awaited, and one byte after a response cancels the keep-alive timer for
good. So a client that connects and sends nothing, or sends a head one byte every few seconds (slowloris), holds its
connection and file descriptor forever; a few thousand such sockets exhaust the server's descriptors and everyone
else is refused. (Once the head is in, the body is bounded by `body_limit.py`, --body-timeout.) uvicorn's
`limit_concurrency` is no remedy: it counts every open connection, idle ones included, and answers 503 to requests
once they reach it, so that many silent sockets would turn every real client away instead.

`header_deadline_protocol(seconds)` is H11Protocol plus one timer per connection, armed whenever the connection
waits for a request head: when it opens, and when a keep-alive connection starts its next request cycle (the
previous response sent and its request read, so the idle keep-alive time counts). It is cancelled once h11 has
parsed a whole head. Bytes arriving do not re-arm it: it bounds the whole head, so a trickle cannot stretch it as
it would an idle timer. When it runs out:

- no byte of the next request came (a silent new connection, an idle keep-alive one): the connection is closed
  without an answer, as uvicorn's keep-alive timer does. A 408 there could cross a request that the client is just
  sending on a reused connection; a silent close is what clients expect of an idle connection, and retry.
- part of a head came: 408 Request Timeout with `Connection: close`, then the close. h11 lets a server answer
  before any request (uvicorn sends its 400 for a malformed head that way) and marks the connection as closing, so
  the answer is well-formed HTTP, and a client that is merely slow learns why it was cut off.

The protocol is named explicitly (uvicorn's default "auto" means httptools when that is installed; its protocol has
the same gap but another parser). What is hooked, checked by `check_uvicorn_hooks` when the server is built so that
a uvicorn that renames any of it fails at start instead of leaving heads unbounded (or cutting every connection):
the methods `connection_made`, `connection_lost` (asyncio's) and `handle_events` (uvicorn's: it runs after every
`data_received` and when a keep-alive connection starts its next cycle), and the attributes `conn` (the
h11.Connection: `their_state`, `trailing_data`), `transport` and `loop`.
"""

from __future__ import annotations

import asyncio
import functools

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from codeparrot.errors import CodeParrotError

HOOKED_METHODS = ("connection_made", "connection_lost", "handle_events")
HOOKED_ATTRIBUTES = ("conn", "transport", "loop")


class HeaderDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol; a request head must arrive within `header_timeout` seconds of the connection opening
    or of the previous response's end."""

    header_timeout: float = 10.0
    _head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._follow_head_state()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_deadline()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        self._follow_head_state()

    def _follow_head_state(self) -> None:
        """Arm the deadline if a head is awaited and none is armed (never re-armed by bytes); cancel it if not."""
        awaiting_head = self.conn.their_state is h11.IDLE and not self.transport.is_closing()
        if not awaiting_head:
            self._cancel_head_deadline()
        elif self._head_deadline is None:
            self._head_deadline = self.loop.call_later(self.header_timeout, self._head_deadline_passed)

    def _cancel_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_deadline_passed(self) -> None:
        self._head_deadline = None
        if self.transport.is_closing():
            return
        if self.conn.trailing_data[0].lstrip(b"\r\n"):  # part of a head: say why before closing
            self._send_408()
        self.transport.close()

    def _send_408(self) -> None:
        body = f"no complete request head within {self.header_timeout:g} s (--header-timeout)\n".encode()
        headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        try:
            data = self.conn.send(h11.Response(status_code=408, headers=headers, reason=b"Request Timeout"))
            data += self.conn.send(h11.Data(data=body)) + self.conn.send(h11.EndOfMessage())
        except h11.LocalProtocolError:  # h11 refuses an answer in this state: the close alone
            return
        self.transport.write(data)


def header_deadline_protocol(seconds: float) -> type[HeaderDeadlineProtocol]:
    """The protocol class to pass as `uvicorn.Config(http=...)`, with a `seconds` head deadline."""
    check_uvicorn_hooks()
    return type("HeaderDeadlineProtocol", (HeaderDeadlineProtocol,), {"header_timeout": seconds})


@functools.cache
def check_uvicorn_hooks() -> None:
    """Raise `CodeParrotError` unless this uvicorn's H11Protocol still has what `HeaderDeadlineProtocol` hooks (the
    attributes are looked for on an instance built for the purpose, never connected)."""
    missing = [f"{name}()" for name in HOOKED_METHODS if not callable(getattr(H11Protocol, name, None))]
    if not missing:
        async def noop_app(scope, receive, send) -> None:
            pass

        config = uvicorn.Config(noop_app, lifespan="off", log_config=None)
        loop = asyncio.new_event_loop()
        try:
            probe = H11Protocol(config=config, server_state=ServerState(), app_state={}, _loop=loop)
        except TypeError as err:  # its constructor changed: what it sets up may have too
            probe, missing = None, [f"constructor as in 0.54 ({err})"]
        finally:
            loop.close()
        if probe is not None:
            missing = [name for name in HOOKED_ATTRIBUTES if not hasattr(probe, name)]
            if not missing and not all(hasattr(probe.conn, name) for name in ("their_state", "trailing_data")):
                missing = ["conn.their_state / conn.trailing_data"]
    if missing:
        raise CodeParrotError(
            f"uvicorn {uvicorn.__version__}'s H11Protocol has no {', '.join(missing)}, which the request-head "
            "deadline (--header-timeout, codeparrot/serving/header_timeout.py) hooks: pin an uvicorn it knows "
            "(0.54) or update that module")
