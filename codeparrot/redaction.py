"""Credentials scrubbed from text before it reaches an error message, a log line, a saved config or a tracker.

One pattern set for the whole project: Hugging Face user/org tokens (`hf_...`, `api_org_...`) keep their prefix
and lose the rest, and credentials inside URLs (`https://user:secret@host`) are replaced. Keys that *name* a
secret (hf_token, wandb_api_key, ...) are handled by `train_logging.redact`, because a 40-hex W&B key looks like
a git commit id and cannot be recognised by its value.
"""

from __future__ import annotations

import re

_TOKEN_VALUE = re.compile(r"(hf_|api_org_)[A-Za-z0-9]{8,}")
_URL_CREDENTIALS = re.compile(r"(://)[^/@\s]+@")


def scrub_secrets(text: str) -> str:
    """`text` with token-shaped values and URL credentials replaced by `***` (token prefixes kept)."""
    return _TOKEN_VALUE.sub(r"\1***", _URL_CREDENTIALS.sub(r"\1***@", text))
