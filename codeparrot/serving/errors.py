"""What a request did wrong (or what went wrong with it), and how each API says so on the wire.

Every refusal and failure is an `ApiError` with a kind; the route family decides the body:

- TGI routes (`/generate`, `/generate_stream`, `/`, `/info`, ...): `{"error": MESSAGE, "error_type": KIND}` with
  TGI's statuses: 422 validation, 429 overloaded, 424 generation (the model failed), 401 unauthorized, and HTTP's
  408 timeout for a request body that did not arrive in time (TGI has no kind for it); what
  `huggingface_hub` and `text_generation` turn into their ValidationError, OverloadedError, GenerationError.
- OpenAI routes (`/v1/...`): `{"error": {"message", "type", "param", "code"}}` with OpenAI's statuses: 400
  invalid_request_error, 401 invalid_api_key, 429 rate limit, 500 server_error. The body also carries
  `detail: [{"loc", "msg", "type"}]`, the shape llm-ls' `openai` backend parses errors from, so the editor shows
  the message instead of "failed to parse".

A message is one line naming the field and the limit; it never holds a traceback or the server's files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["validation", "overloaded", "generation", "unauthorized", "not_found", "not_allowed", "too_large",
               "unavailable", "internal", "timeout"]

# TGI's statuses; the OpenAI routes use OpenAI's own (400 for every invalid request).
TGI_STATUS: dict[str, int] = {"validation": 422, "overloaded": 429, "generation": 424, "unauthorized": 401,
                              "not_found": 404, "not_allowed": 405, "too_large": 413, "unavailable": 503,
                              "internal": 500, "timeout": 408}
OPENAI_STATUS: dict[str, int] = {**TGI_STATUS, "validation": 400, "generation": 500}
OPENAI_TYPE: dict[str, str] = {"validation": "invalid_request_error", "overloaded": "rate_limit_error",
                               "generation": "server_error", "unauthorized": "invalid_request_error",
                               "not_found": "invalid_request_error", "not_allowed": "invalid_request_error",
                               "too_large": "invalid_request_error", "timeout": "invalid_request_error",
                               "unavailable": "server_error", "internal": "server_error"}
OPENAI_CODE: dict[str, str | None] = {"overloaded": "rate_limit_exceeded", "unauthorized": "invalid_api_key",
                                      "not_found": "not_found", "too_large": "request_too_large",
                                      "timeout": "request_timeout"}


@dataclass
class ApiError(Exception):
    """A request refused or failed: `message` (one line), its `kind`, and the request field it is about."""

    message: str
    kind: Kind = "validation"
    param: str | None = None

    def __str__(self) -> str:
        return self.message


def is_openai_path(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/")


def error_status(err: ApiError, path: str) -> int:
    return (OPENAI_STATUS if is_openai_path(path) else TGI_STATUS)[err.kind]


def error_body(err: ApiError, path: str) -> dict:
    """The JSON body of `err` in the format of the API that `path` belongs to."""
    if not is_openai_path(path):
        return {"error": err.message, "error_type": err.kind}
    return {"error": {"message": err.message, "type": OPENAI_TYPE[err.kind], "param": err.param,
                      "code": OPENAI_CODE.get(err.kind)},
            "detail": [{"loc": err.param or "body", "msg": err.message, "type": err.kind}]}


def stream_error_event(err: ApiError, path: str) -> dict:
    """What a stream sends when generation fails after its first event (the status line is already sent): TGI's
    `{"error", "error_type"}` event, or OpenAI's error object."""
    body = error_body(err, path)
    body.pop("detail", None)
    return body
