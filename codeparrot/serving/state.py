"""What every route shares: the engine, the tokenizer with the prompt rules, the limits, and the bridge that carries
a request's events from the engine thread to the route's coroutine.

Prompts: EOS + the text, never stripped (an editor's prompt ends where the cursor is, and its trailing spaces and
newlines are part of it). Training joins files with EOS, so EOS says "a file starts here". Unlike scripts/generate.py
(`build_prompt_ids`, plain text as in training), the FIM sentinels and EOS written in a prompt's text are encoded as
their single special ids: editors' clients (TGI's, llm-ls, Continue) build FIM prompts themselves and send them as
text. The OpenAI route's `suffix` builds the prompt here, from plain text (`fim_prompt_ids`), as generate.py's
`--suffix` does: the same ids for the same prefix and suffix.

Tokenizing is bounded before it starts: no token is longer than the tokenizer's longest one, so a text of more than
`max_input_tokens * longest` characters is refused unread. The rest runs in a worker thread (the event loop stays
free), on the Rust tokenizer's `encode`, which is safe to call from several threads at once.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Annotated

import anyio
from pydantic import Field

from codeparrot.fim import fim_prompt_ids
from codeparrot.fim.encoding import plain_text_encoder
from codeparrot.serving.engine import Engine, Job, JobResult
from codeparrot.serving.errors import ApiError
from codeparrot.serving.sampling import SamplingParams

# Request fields' JSON types, strict in both APIs: a JSON `true` is not the number 1, `"yes"` is not true, `"5"` and
# `5.0` are not the integer 5 (TGI's own parser refuses them too). Pydantic's default (lax) mode converted all of
# these, so a mistyped request ran with settings nobody asked for. A float field takes an integer (`temperature: 0`).
Int = Annotated[int, Field(strict=True)]
Bool = Annotated[bool, Field(strict=True)]
Float = Annotated[float, Field(strict=True, allow_inf_nan=False)]
# OpenAI's bound on `logprobs` (TGI's default max_top_n_tokens is the same).
MAX_TOP_LOGPROBS = 5
# How often a route waiting for a non-streamed answer checks that its client is still there.
DISCONNECT_POLL_S = 0.5


@dataclass
class Limits:
    """What one request may ask for (scripts/serve.py's flags; the context comes from the model)."""

    context: int  # the model's n_positions: prompt + new tokens must fit
    max_input_tokens: int
    max_new_tokens: int
    max_stop_sequences: int
    max_n: int  # sequences per request: n x prompts (OpenAI), best_of (TGI)


@dataclass
class ModelInfo:
    name: str  # the id clients see (/info's model_id, /v1/models)
    sha: str | None  # the checkpoint's commit when it has one
    dtype: str
    device: str
    fim: bool  # whether the tokenizer has the FIM sentinels (`suffix` needs them)


class ServingState:
    def __init__(self, engine: Engine, tokenizer, limits: Limits, info: ModelInfo, api_key: str | None = None):
        self.engine = engine
        self.tokenizer = tokenizer
        self.limits = limits
        self.info = info
        self.api_key = api_key
        self.eos = tokenizer.eos_token_id
        self._backend = tokenizer.backend_tokenizer
        self._longest_token = max(len(token.encode("utf-8")) for token in tokenizer.get_vocab())
        if info.fim:
            plain_text_encoder(tokenizer).batch(["x"])  # its backend copy built now, not in a first request

    async def prompt_ids(self, text: str, truncate: int | None = None, param: str = "inputs") -> list[int]:
        """EOS + `text`'s tokens (the last `truncate` of them with TGI's `truncate`), within --max-input-tokens.
        With `truncate` the whole text is tokenized (its cut must fall where the whole text's tokens do); the body
        limit bounds that work."""
        def encode() -> list[int]:
            ids = self._backend.encode(text, add_special_tokens=False).ids
            return [self.eos] + (ids[-truncate:] if truncate is not None else ids)

        self._check_unicode(text, param)
        return await self._tokenized(encode, 0 if truncate is not None else len(text), f"`{param}`", param)

    async def fim_prompt_ids(self, prefix: str, suffix: str) -> list[int]:
        """The PSM prompt of the OpenAI route's `prompt` and `suffix`, exactly as the model saw rearranged files in
        training (`codeparrot.fim.fim_prompt_ids`): both encoded as plain text, so code that holds the string
        `<fim_middle>` or `<|endoftext|>` stays code, not a sentinel or the start of another file."""
        self._check_unicode(prefix, "prompt")
        self._check_unicode(suffix, "suffix")
        return await self._tokenized(lambda: fim_prompt_ids(self.tokenizer, prefix, suffix),
                                     len(prefix) + len(suffix), "`prompt` and `suffix`", "prompt")

    async def _tokenized(self, encode, chars: int, what: str, param: str) -> list[int]:
        """`encode()` run in a worker thread when its `chars` characters could fit --max-input-tokens (refused
        unread otherwise), its result within the limit."""
        limit = self.limits.max_input_tokens
        if chars > (limit - 1) * self._longest_token:
            raise ApiError(f"{what} is {chars:,} characters: more than the {limit} tokens this server takes "
                           "(--max-input-tokens) could hold", "validation", param)
        ids = await anyio.to_thread.run_sync(encode)
        if len(ids) > limit:
            raise ApiError(f"{what} is {len(ids)} tokens (with the EOS the server puts first); this server takes "
                           f"at most {limit} (--max-input-tokens)", "validation", param)
        return ids

    @staticmethod
    def _check_unicode(text: str, param: str) -> None:
        """A lone surrogate ("\\ud800" in the JSON) is not text; the Rust tokenizer would only say "must be str"."""
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:
            raise ApiError(f"`{param}` is not valid Unicode (a lone surrogate at character {err.start})",
                           "validation", param) from None

    def new_tokens(self, requested: int | None, prompt_len: int, param: str, default: int | None = None,
                   prompt_param: str = "inputs") -> int:
        """The number of new tokens a request gets: `requested` (or `default`, or as many as fit) within
        --max-new-tokens and the context. `param` / `prompt_param`: the request's names for the two."""
        room = self.limits.context - prompt_len
        if requested is None:
            requested = min(default if default is not None else room, self.limits.max_new_tokens, room)
            if requested >= 1:
                return requested
            raise ApiError(f"the prompt is {prompt_len} tokens and fills the model's context of "
                           f"{self.limits.context}: no room for new tokens", "validation", prompt_param)
        if requested < 1:
            raise ApiError(f"`{param}` must be at least 1, got {requested}", "validation", param)
        if requested > self.limits.max_new_tokens:
            raise ApiError(f"`{param}` must be at most {self.limits.max_new_tokens} (--max-new-tokens), got "
                           f"{requested}", "validation", param)
        if requested > room:
            raise ApiError(f"`{prompt_param}` tokens + `{param}` must be <= {self.limits.context} (the model's "
                           f"context). Given: {prompt_len} `{prompt_param}` tokens and {requested} `{param}`",
                           "validation", param)
        return requested

    def check_stops(self, stops: list[str], param: str = "stop") -> tuple[str, ...]:
        if len(stops) > self.limits.max_stop_sequences:
            raise ApiError(f"`{param}` holds {len(stops)} stop sequences; at most {self.limits.max_stop_sequences} "
                           "(--max-stop-sequences)", "validation", param)
        if any(not s for s in stops):
            raise ApiError(f"`{param}`: a stop sequence cannot be empty", "validation", param)
        return tuple(stops)

    def token_text(self, token_id: int) -> str:
        """One token's own text (special tokens by name), for details and logprobs listings."""
        return self.tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)


class Submissions:
    """One or more engine jobs whose events arrive on one asyncio queue as (tag, event); cancels whatever is still
    running when closed (a client that went away, a route that failed)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.queue: asyncio.Queue = asyncio.Queue()
        self.jobs: list[Job] = []
        self._open: set[int] = set()
        self._loop = asyncio.get_running_loop()

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> None:
        tag = len(self.jobs)

        def listener(event, tag=tag):  # called in the engine thread
            self._loop.call_soon_threadsafe(self.queue.put_nowait, (tag, event))

        try:
            self.jobs.append(self.engine.submit(prompt_ids, params, listener))
        except ApiError:
            self.close()  # a later prompt of the same request was refused: drop the earlier ones too
            raise
        self._open.add(tag)

    async def next(self) -> tuple[int, tuple]:
        tag, event = await self.queue.get()
        if event[0] in ("done", "error"):
            self._open.discard(tag)
        return tag, event

    @property
    def finished(self) -> bool:
        return not self._open

    async def results(self, request) -> list[JobResult]:
        """Every job's result, in submission order; the first error raises. Polls the client meanwhile: if it
        disconnected, the jobs are cancelled (their rows leave the batch) and the route ends."""
        results: dict[int, JobResult] = {}
        try:
            while not self.finished:
                try:
                    tag, event = await asyncio.wait_for(self.next(), DISCONNECT_POLL_S)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():  # the answer has nobody to go to
                        raise ApiError("the client disconnected", "unavailable") from None
                    continue
                if event[0] == "error":
                    raise event[1]
                if event[0] == "done":
                    results[tag] = event[1]
        finally:
            self.close()
        return [results[tag] for tag in range(len(self.jobs))]

    def close(self) -> None:
        for tag, job in enumerate(self.jobs):
            if tag in self._open:
                self.engine.cancel(job)
        self._open.clear()
