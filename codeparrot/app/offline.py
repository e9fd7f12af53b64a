"""Keep the app on loopback: Gradio's analytics, version check, share link, run history and Hub telemetry are
switched off, and no request makes the server fetch a URL.

Gradio 6 decides at `Blocks()` time from `GRADIO_ANALYTICS_ENABLED` whether to start a thread that fetches
`https://api.gradio.app/pkg-version` (the version check) and to post usage analytics; with it off it also sets
`HF_HUB_DISABLE_TELEMETRY`. `share=False` keeps it from downloading the FRP tunnel client and opening a public
link; SSR (a Node server) and the MCP server stay off. The default theme's fonts are served by the app itself
(`LocalFont`), so the browser fetches nothing from Google Fonts either.

What a client could otherwise make the server do beyond loopback: Gradio's run history (`/gradio_api/run-history/`,
served without the login) lists, creates and writes Hub buckets with this machine's own Hugging Face token for
any request that comes from loopback (a local user, or a proxy on this machine), so it is off (`run_history`);
`/gradio_api/file=<URL>` fetches any public URL and streams it back, and a file given as a URL in any input of
any event (`{"path": "https://...", "meta": {"_type": "gradio.FileData"}}`, where the page sends an upload) is
downloaded before any handler runs: both refused by `RefuseRemoteFiles`, an ASGI middleware in front of every
route (a check on the components would miss the copies Gradio makes of them per session).
"""

from __future__ import annotations

import json
import os

OFFLINE_ENV = {
    "GRADIO_ANALYTICS_ENABLED": "False",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "GRADIO_SHARE": "False",
    "GRADIO_SSR_MODE": "False",
    "GRADIO_MCP_SERVER": "False",
    "GRADIO_RUN_HISTORY": "False",
    "DO_NOT_TRACK": "1",
}
REMOTE_REFUSED = "this app serves only its own files: upload a file instead of giving a URL"


def go_offline() -> None:
    """Set the environment switches (overriding a user's `GRADIO_ANALYTICS_ENABLED=True`); call before
    `import gradio` and before building any Blocks."""
    os.environ.update(OFFLINE_ENV)


def launch_kwargs(host: str, port: int | None) -> dict:
    """`Blocks.launch` arguments of an offline app on `host:port` (port None or 0: a free one)."""
    from starlette.middleware import Middleware

    return {"server_name": host, "server_port": port or None, "share": False, "ssr_mode": False,
            "mcp_server": False, "inbrowser": False, "show_error": False, "quiet": True,
            "prevent_thread_lock": True, "run_history": False,
            "app_kwargs": {"middleware": [Middleware(RefuseRemoteFiles)]}}


def names_remote_file(path: str) -> bool:
    """Whether a request path asks Gradio's file route for a URL (`.../file=https://...`), not a local file."""
    _, route, rest = path.partition("/file=")
    return bool(route) and "://" in rest


def holds_remote_file(body: bytes) -> bool:
    """Whether a JSON request body holds a file object whose path is an http(s) URL (Gradio would download
    it: `gradio.processing_utils.async_move_files_to_cache`); False for anything that is not JSON."""
    try:
        stack = [json.loads(body)]
    except (ValueError, RecursionError):  # not JSON (an upload's bytes, a form): no file object in it
        return False
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            meta, path = item.get("meta"), item.get("path")
            if (isinstance(meta, dict) and meta.get("_type") == "gradio.FileData" and isinstance(path, str)
                    and path.strip().lower().startswith(("http://", "https://"))):
                return True
            stack.extend(item.values())
    return False


class RefuseRemoteFiles:
    """ASGI middleware: a 403 for `/gradio_api/file=<URL>` and for any request whose JSON body gives a file as a
    URL, before Gradio looks the host up."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if names_remote_file(scope.get("path", "")):
            await _refuse(scope, receive, send)
            return
        if scope.get("method") in ("GET", "HEAD") or _form_body(scope):
            await self.app(scope, receive, send)  # no JSON body (an upload's bytes are not read here)
            return
        messages = []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
        body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.request")

        async def replay():
            return messages.pop(0) if messages else await receive()

        if holds_remote_file(body):
            await _refuse(scope, replay, send)
            return
        await self.app(scope, replay, send)


_FORM_TYPES = (b"multipart/form-data", b"application/x-www-form-urlencoded")


def _form_body(scope) -> bool:
    """Whether the request's body is a form (an upload), which no route reads as JSON: every Content-Type header
    it has (Starlette reads the first, so one form header beside a JSON one is not enough) names exactly a form
    media type (a prefix is not enough: FastAPI reads `application/x-www-...+json` as JSON)."""
    types = [value.split(b";", 1)[0].strip() for name, value in scope.get("headers") or []
             if name.lower() == b"content-type"]  # case kept: Gradio's component route matches it as sent
    return bool(types) and all(t in _FORM_TYPES for t in types)


async def _refuse(scope, receive, send) -> None:
    from starlette.responses import PlainTextResponse

    await PlainTextResponse(REMOTE_REFUSED, status_code=403)(scope, receive, send)
