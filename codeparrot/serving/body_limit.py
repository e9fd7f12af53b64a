"""Bounds on request bodies, in size (413) and in time (408), answered in the route's API format.

Starlette's own limit answers with a plain-text "Content Too Large", and a body error raised while FastAPI reads it
becomes a generic 400; neither is TGI's or OpenAI's error format. This middleware reads the body itself (every
route here takes a small JSON body, which FastAPI would read whole anyway), up to the limit, and hands it on. A body
over the limit (its Content-Length says so, or the bytes do) is answered 413 after the rest of it is read and
dropped, up to `DRAIN_LIMIT`: a client still uploading when the server answers and closes would often see a reset
connection instead of the answer.

Time: uvicorn (0.54 here) bounds only idle keep-alive connections (`timeout_keep_alive`, between requests); once a
request's headers are in, it waits for the body as long as the client likes, so a client that declares a
Content-Length and never sends the bytes held its connection, and its task here, forever (a few thousand such
sockets exhaust the server's file descriptors). The whole body must arrive within `timeout` seconds of the headers
(--body-timeout); if not, the answer is 408 (or the 413 already due) and the connection is closed.
"""

from __future__ import annotations

import json
from typing import Callable

import anyio

from codeparrot.serving.errors import ApiError, error_body, error_status

DRAIN_LIMIT = 64 << 20  # bytes read and dropped at most, so that the client gets to read the 413


def as_json(scope: dict) -> dict:
    """`scope` with a POST body declared JSON, whatever its Content-Type said: every route takes JSON, and clients
    such as `curl -d` send it as application/x-www-form-urlencoded, which FastAPI would refuse with a message
    about dictionaries ("Input should be a valid dictionary"). A body that is not JSON still gets the API's
    malformed-JSON error."""
    if scope.get("method") != "POST":
        return scope
    headers = [(k, v) for k, v in scope.get("headers") or [] if k.lower() != b"content-type"]
    return {**scope, "headers": headers + [(b"content-type", b"application/json")]}


class BodyLimit:
    """ASGI middleware: `app` sees bodies of at most `max_bytes`, read within `timeout` seconds; larger requests get
    a 413, slower ones a 408."""

    def __init__(self, app, max_bytes: int, timeout: float = 30.0):
        self.app = app
        self.max_bytes = max_bytes
        self.timeout = timeout

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        too_large = declared.isdigit() and int(declared) > self.max_bytes
        chunks, size, more = [], 0, True
        with anyio.move_on_after(self.timeout) as deadline:
            while more:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                body = message.get("body", b"")
                more = message.get("more_body", False)
                size += len(body)
                if size > self.max_bytes:
                    too_large = True
                if too_large:
                    chunks = []
                    if size > DRAIN_LIMIT:
                        break
                else:
                    chunks.append(body)
        if too_large:
            await self._refuse(scope, send, ApiError(f"the request body is larger than {self.max_bytes // 1024} KB "
                                                     "(--max-request-kb)", "too_large"))
            return
        if deadline.cancelled_caught:
            await self._refuse(scope, send, ApiError(f"the request body did not arrive within {self.timeout:g} s "
                                                     f"(--body-timeout; {size:,} byte(s) came)", "timeout"))
            return
        replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replayed() -> dict:
            return replay.pop() if replay else await receive()

        await self.app(as_json(scope), replayed, send)

    async def _refuse(self, scope, send: Callable, err: ApiError) -> None:
        """Answer `err` and close the connection (`Connection: close`: the rest of the body, if any, is not read)."""
        path = scope.get("path", "/")
        data = json.dumps(error_body(err, path)).encode()
        await send({"type": "http.response.start", "status": error_status(err, path),
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": data})
