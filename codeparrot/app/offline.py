"""Keep the app on loopback: Gradio's analytics, version check, share link and Hub telemetry are switched off.

Gradio 6 decides at `Blocks()` time from `GRADIO_ANALYTICS_ENABLED` whether to start a thread that fetches
`https://api.gradio.app/pkg-version` (the version check) and to post usage analytics; with it off it also sets
`HF_HUB_DISABLE_TELEMETRY`. `share=False` keeps it from downloading the FRP tunnel client and opening a public
link; SSR (a Node server) and the MCP server stay off. The default theme's fonts are served by the app itself
(`LocalFont`), so the browser fetches nothing from Google Fonts either.
"""

from __future__ import annotations

import os

OFFLINE_ENV = {
    "GRADIO_ANALYTICS_ENABLED": "False",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "GRADIO_SHARE": "False",
    "GRADIO_SSR_MODE": "False",
    "GRADIO_MCP_SERVER": "False",
    "DO_NOT_TRACK": "1",
}


def go_offline() -> None:
    """Set the environment switches (overriding a user's `GRADIO_ANALYTICS_ENABLED=True`); call before
    `import gradio` and before building any Blocks."""
    os.environ.update(OFFLINE_ENV)


def launch_kwargs(host: str, port: int | None) -> dict:
    """`Blocks.launch` arguments of an offline app on `host:port` (port None or 0: a free one)."""
    return {"server_name": host, "server_port": port or None, "share": False, "ssr_mode": False,
            "mcp_server": False, "inbrowser": False, "show_error": False, "quiet": True,
            "prevent_thread_lock": True}
