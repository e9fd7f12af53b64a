"""A bound on request bodies that answers 413 in the route's API format.

Starlette's own limit answers with a plain-text "Content Too Large", and a body error raised while FastAPI reads it
becomes a generic 400; neither is TGI's or OpenAI's error format. This middleware reads the body itself (every
route here takes a small JSON body, which FastAPI would read whole anyway), up to the limit, and hands it on. A body
over the limit (its Content-Length says so, or the bytes do) is answered 413 after the rest of it is read and
dropped, up to `DRAIN_LIMIT`: a client still uploading when the server answers and closes would often see a reset
connection instead of the answer.
"""

from __future__ import annotations

import json
from typing import Callable

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
    """ASGI middleware: `app` sees bodies of at most `max_bytes`; larger requests get `message(path)`'s 413."""

    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        too_large = declared.isdigit() and int(declared) > self.max_bytes
        chunks, size, more = [], 0, True
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
            await self._refuse(scope, send)
            return
        replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replayed() -> dict:
            return replay.pop() if replay else await receive()

        await self.app(as_json(scope), replayed, send)

    async def _refuse(self, scope, send: Callable) -> None:
        err = ApiError(f"the request body is larger than {self.max_bytes // 1024} KB (--max-request-kb)", "too_large")
        path = scope.get("path", "/")
        data = json.dumps(error_body(err, path)).encode()
        await send({"type": "http.response.start", "status": error_status(err, path),
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": data})
