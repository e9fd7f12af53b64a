"""The HTTP application: TGI's routes, OpenAI's routes, bearer-key auth, body limit, and errors in each API's format.

    GET  /health                   200 while the engine runs (no key needed: for load balancers)
    GET  /info                     TGI's model and limits
    POST /generate                 TGI: {"generated_text", "details"}
    POST /generate_stream          TGI: server-sent events
    POST /                         TGI's compatibility route: [answer], or events with "stream": true
    POST /v1/completions           OpenAI completions (suffix = fill-in-the-middle), stream: chunks + [DONE]
    GET  /v1/models                OpenAI's model list (the one served model)

Every request body is bounded in size and in time (--max-request-kb, 413; --body-timeout, 408: `body_limit.py`; the
head before it, --header-timeout, is bounded below the app, in the protocol: `header_timeout.py`), validated by its
schema (pydantic, strict for numbers and booleans; TGI routes answer 422, OpenAI routes 400, in one line naming the
field and never echoing the input) and then by the API module's rules.
Streams are Starlette `StreamingResponse`s of server-sent events; when the client disconnects, Starlette cancels the
response's task, the generator's `finally` cancels the engine job, and its rows leave the batch at the next step.
A request waiting for a non-streamed answer polls its connection for the same reason.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from typing import AsyncIterator

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response, StreamingResponse

from codeparrot.serving import openai_api, tgi
from codeparrot.serving.body_limit import BodyLimit
from codeparrot.serving.errors import ApiError, error_body, error_status, stream_error_event
from codeparrot.serving.state import ServingState, Submissions

log = logging.getLogger("codeparrot.serving")
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse(data: dict | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {text}\n\n".encode("utf-8")


def _validation_message(err: RequestValidationError) -> tuple[str, str | None]:
    """One line from pydantic's errors: the first one's field and message (never the input, which may be 10 MB)."""
    errors = err.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        reason = (first.get("ctx") or {}).get("error", "")
        position = first.get("loc", [None, None])[-1]
        return f"the request body is not valid JSON ({reason} at position {position})", None
    field = _field(first)
    # A union (OpenAI's prompt: a string or a list) fails once per member: one message for the field.
    same = [e for e in errors if _field(e) == field]
    reasons = "; ".join(dict.fromkeys(e.get("msg", "invalid") for e in same))
    others = len({_field(e) for e in errors}) - 1
    more = f" (and {others} more field(s))" if others else ""
    return (f"{field}: " if field else "request body: ") + f"{reasons}{more}", field


def _field(error: dict) -> str | None:
    """The dotted field an error is about, without "body" and the union-member tags pydantic adds (`str`,
    `list[int]`, ...)."""
    tags = {"str", "int", "float", "bool", "dict", "list", "none"}
    parts = [str(p) for p in error.get("loc", ()) if p != "body"
             and not (isinstance(p, str) and ("[" in p or p.lower() in tags))]
    return ".".join(parts) or None


def _api_error_response(request: Request, err: ApiError) -> JSONResponse:
    path = request.url.path
    headers = {"WWW-Authenticate": "Bearer"} if err.kind == "unauthorized" else None
    return JSONResponse(error_body(err, path), status_code=error_status(err, path), headers=headers)


def build_app(state: ServingState, max_request_bytes: int = 1 << 20, body_timeout: float = 30.0) -> FastAPI:
    """The ASGI application serving `state`'s engine."""
    # No docs pages or OpenAPI schema: less to expose. A body is read as JSON whatever its content type (BodyLimit).
    app = FastAPI(title="CodeParrot completion server", docs_url=None, redoc_url=None, openapi_url=None,
                  strict_content_type=False)
    app.add_middleware(BodyLimit, max_bytes=max_request_bytes, timeout=body_timeout)
    started = int(time.time())

    async def api_error(request: Request, err: ApiError):
        return _api_error_response(request, err)

    async def validation_error(request: Request, err: RequestValidationError):
        message, field = _validation_message(err)
        return _api_error_response(request, ApiError(message, "validation", field))

    async def http_error(request: Request, err: StarletteHTTPException):
        kinds = {401: "unauthorized", 404: "not_found", 405: "not_allowed"}
        message = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed on {request.url.path}"}
        return _api_error_response(request, ApiError(message.get(err.status_code, str(err.detail)),
                                                     kinds.get(err.status_code, "validation")))

    async def internal_error(request: Request, err: Exception):
        log.error("internal error on %s", request.url.path, exc_info=err)
        return _api_error_response(request, ApiError(f"internal error ({type(err).__name__})", "internal"))

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, internal_error)

    def authorized(request: Request) -> None:
        if state.api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), state.api_key.encode()):
            raise ApiError("missing or wrong API key: send the header `Authorization: Bearer <key>`", "unauthorized")

    auth = [Depends(authorized)]

    @app.get("/health")
    async def health():
        if state.engine.failure:
            raise ApiError(f"the engine stopped: {state.engine.failure}", "unavailable")
        return Response(status_code=200)

    @app.get("/info", dependencies=auth)
    async def info():
        return JSONResponse(tgi.info(state))

    @app.post("/generate", dependencies=auth)
    async def generate(body: tgi.TgiRequest, request: Request):
        return JSONResponse(await _tgi_answer(state, body, request))

    @app.post("/generate_stream", dependencies=auth)
    async def generate_stream(body: tgi.TgiRequest, request: Request):
        return await _tgi_stream(state, body, request)

    @app.post("/", dependencies=auth)
    async def compat(body: tgi.TgiRequest, request: Request):
        if body.stream:
            return await _tgi_stream(state, body, request)
        return JSONResponse([await _tgi_answer(state, body, request)])

    @app.post("/v1/completions", dependencies=auth)
    async def completions(body: openai_api.CompletionRequest, request: Request):
        return await _completions(state, body, request)

    @app.get("/v1/models", dependencies=auth)
    async def models():
        return JSONResponse(openai_api.models(state, started))

    return app


# ---------------------------------------------------------------------------------------------------- TGI
async def _tgi_answer(state: ServingState, body: tgi.TgiRequest, request: Request) -> dict:
    prompt, params = await tgi.to_job(state, body, stream=False)
    jobs = Submissions(state.engine)
    jobs.submit(prompt, params)
    [result] = await jobs.results(request)
    return tgi.generate_answer(state, body, result)


async def _tgi_stream(state: ServingState, body: tgi.TgiRequest, request: Request) -> StreamingResponse:
    prompt, params = await tgi.to_job(state, body, stream=True)
    jobs = Submissions(state.engine)
    jobs.submit(prompt, params)  # an overloaded server answers 429 here, before the stream starts
    writer = tgi.StreamWriter(state, body, len(prompt))
    path = request.url.path

    async def events() -> AsyncIterator[bytes]:
        try:
            while not jobs.finished:
                _, event = await jobs.next()
                if event[0] == "token":
                    out = writer.token(event[2], event[3] is not None)
                elif event[0] == "done":
                    out = writer.done(event[1])
                else:
                    out = [stream_error_event(event[1], path)]
                for item in out:
                    yield sse(item)
        finally:  # also when the client disconnected: the job leaves the batch
            jobs.close()

    return StreamingResponse(events(), media_type="text/event-stream", headers=SSE_HEADERS)


# ------------------------------------------------------------------------------------------------- OpenAI
async def _completions(state: ServingState, body: openai_api.CompletionRequest, request: Request) -> Response:
    prompts, ids, params = await openai_api.to_jobs(state, body)
    jobs = Submissions(state.engine)
    for prompt_ids in ids:
        jobs.submit(prompt_ids, params)
    if not body.stream:
        results = await jobs.results(request)
        return JSONResponse(openai_api.completion_answer(state, body, prompts, results))
    stream = openai_api.CompletionStream(state, body, prompts, params)
    path = request.url.path

    async def events() -> AsyncIterator[bytes]:
        try:
            for chunk in stream.start():
                yield sse(chunk)
            while not jobs.finished:
                tag, event = await jobs.next()
                if event[0] == "token":
                    out = stream.token(tag, event[1], event[2], event[3])
                elif event[0] == "done":
                    out = stream.done(tag, event[1])
                else:
                    yield sse(stream_error_event(event[1], path))
                    break
                for chunk in out:
                    yield sse(chunk)
            else:
                for chunk in stream.end():
                    yield sse(chunk)
            yield sse("[DONE]")
        finally:
            jobs.close()

    return StreamingResponse(events(), media_type="text/event-stream", headers=SSE_HEADERS)
