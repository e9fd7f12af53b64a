"""OpenAI's completions API (`POST /v1/completions`, `GET /v1/models`): the request schema, its validation into engine
settings, the answer, and the stream of chunks ending in `data: [DONE]`.

What the `openai` SDK's `completions.create`, Continue (with `useLegacyCompletionsEndpoint`) and llm-ls' `openai`
backend send. OpenAI's rules kept: `max_tokens` defaults to 16, `temperature` to 1 (0: greedy), the stop sequence is
cut away (finish_reason "stop", as for the end of text), `n` choices per prompt, a list of prompts gives
`len(prompts) * n` choices (index = prompt * n + i), `echo` puts the prompt in front, `logprobs` (0-5) lists the
tokens with their log-probabilities, `stream_options.include_usage` adds a usage chunk.

`suffix` is the point of this endpoint here: a non-empty `suffix` turns the request into fill-in-the-middle, the
model's own PSM prompt `<fim_prefix>PROMPT<fim_suffix>SUFFIX<fim_middle>` (`codeparrot.fim.fim_prompt_ids`: code that
holds a sentinel's string keeps it as text, as in training), and the choice's text is the middle (generation ends at
EOS or a sentinel). TGI answers `suffix` with 422 and vLLM with 400, so clients of those build the prompt themselves;
with this server they need not (they still may). An empty or null `suffix` is a plain completion.

Differences: the `model` field is accepted whatever it names (one model per server; answers carry the served name);
a stop list may hold up to --max-stop-sequences strings (OpenAI: 4); vLLM's `top_k` is applied (0 or -1: off);
refused as unsupported: token-id prompts, penalties, `logit_bias`, `best_of` other than `n`, `logprobs` with
`stream`, and vLLM's other sampling extras (`UNSUPPORTED`) unless neutral. Other unknown fields are ignored. Types
are strict (`state.Int`, `Bool`, `Float`): `true` for a number, `"yes"` for a boolean or `5.0` for an integer is a
400, never converted. More prompts than --max-concurrent-requests is a 400 too (it could never run: each prompt is a
request of the engine's), not the 429 "retry later" it was.
"""

from __future__ import annotations

import json
import time
import uuid

from pydantic import BaseModel, ConfigDict

from codeparrot.serving.engine import JobResult, SequenceResult, Token
from codeparrot.serving.errors import ApiError
from codeparrot.serving.sampling import SamplingParams
from codeparrot.serving.state import MAX_TOP_LOGPROBS, Bool, Float, Int, ServingState
from codeparrot.serving.text import IncrementalDecoder, find_stop, held_back, stop_search_start

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions
# Settings that would change the answer and are not implemented, with the value that changes nothing (accepted, as
# is leaving them out). vLLM's extras among them are what OpenAI-compatible clients send: as unknown fields they were
# dropped silently, so a client asking for them got an answer that had ignored them.
UNSUPPORTED = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "logit_bias": {}, "repetition_penalty": 1.0,
               "min_p": 0.0, "min_tokens": 0, "ignore_eos": False, "stop_token_ids": [],
               "include_stop_str_in_output": False, "use_beam_search": False}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: Bool = False


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    prompt: str | list[str] | list[Int] | list[list[Int]] | None = None
    suffix: str | None = None
    max_tokens: Int | None = None
    temperature: Float | None = None
    top_p: Float | None = None
    n: Int | None = None
    stream: Bool | None = None
    stream_options: StreamOptions | None = None
    logprobs: Int | None = None
    echo: Bool | None = None
    stop: str | list[str] | None = None
    presence_penalty: Float | None = None
    frequency_penalty: Float | None = None
    best_of: Int | None = None
    logit_bias: dict[str, Float] | None = None
    seed: Int | None = None
    user: str | None = None
    # vLLM's sampling extras
    top_k: Int | None = None
    repetition_penalty: Float | None = None
    min_p: Float | None = None
    min_tokens: Int | None = None
    ignore_eos: Bool | None = None
    stop_token_ids: list[Int] | None = None
    include_stop_str_in_output: Bool | None = None
    use_beam_search: Bool | None = None


def _bad(message: str, param: str) -> ApiError:
    return ApiError(message, "validation", param)


def prompts_of(req: CompletionRequest) -> list[str]:
    prompt = req.prompt
    if prompt is None or (isinstance(prompt, list) and not prompt):
        raise _bad("`prompt` is required: a string or a list of strings", "prompt")
    if isinstance(prompt, str):
        return [prompt]
    if not all(isinstance(p, str) for p in prompt):
        raise _bad("`prompt` as token ids is not supported by this server: send text", "prompt")
    return list(prompt)


async def to_jobs(state: ServingState, req: CompletionRequest) -> tuple[list[str], list[list[int]], SamplingParams]:
    """(the prompt texts, their ids, the settings all share), or a 400 `ApiError` naming the field."""
    prompts = prompts_of(req)
    n = 1 if req.n is None else req.n
    if n < 1:
        raise _bad(f"`n` must be at least 1, got {n}", "n")
    if len(prompts) * n > state.limits.max_n:
        raise _bad(f"{len(prompts)} prompt(s) x n={n} is {len(prompts) * n} choices; this server gives at most "
                   f"{state.limits.max_n} per request (--max-n)", "n")
    if len(prompts) > state.engine.max_requests:  # each prompt is one engine request: a 429 would never clear
        raise _bad(f"{len(prompts)} prompts in one request; this server runs at most {state.engine.max_requests} "
                   "requests at once (--max-concurrent-requests): send fewer per request", "prompt")
    if req.best_of not in (None, n):
        raise _bad("`best_of` other than `n` is not supported by this server", "best_of")
    temperature = 1.0 if req.temperature is None else req.temperature
    if not 0 <= temperature <= 2:
        raise _bad(f"`temperature` must be in [0, 2], got {temperature}", "temperature")
    top_p = 1.0 if req.top_p is None else req.top_p
    if not 0 < top_p <= 1:
        raise _bad(f"`top_p` must be in (0, 1], got {top_p}", "top_p")
    top_k = req.top_k or 0
    if top_k < -1:
        raise _bad(f"`top_k` must be at least 1, or 0 or -1 for no top-k cut; got {top_k}", "top_k")
    for name, neutral in UNSUPPORTED.items():
        if getattr(req, name) not in (None, neutral):
            raise _bad(f"`{name}` is not supported by this server (leave it out or {json.dumps(neutral)})", name)
    logprobs = req.logprobs or 0
    if not 0 <= logprobs <= MAX_TOP_LOGPROBS:
        raise _bad(f"`logprobs` must be in [0, {MAX_TOP_LOGPROBS}], got {logprobs}", "logprobs")
    if req.logprobs is not None and req.stream:
        raise _bad("`logprobs` with `stream` is not supported by this server", "logprobs")
    if req.stream_options is not None and not req.stream:
        raise _bad("`stream_options` is only allowed with `stream`", "stream_options")
    if req.seed is not None and not 0 <= req.seed < 2**64:
        raise _bad(f"`seed` must be in [0, 2^64), got {req.seed}", "seed")
    stops = state.check_stops([req.stop] if isinstance(req.stop, str) else list(req.stop or []))
    if req.suffix and req.echo:
        raise _bad("`echo` is not supported with `suffix`", "echo")
    if req.suffix and not state.info.fim:
        raise _bad("`suffix` (fill-in-the-middle) needs the FIM tokens, and this model's tokenizer lacks them "
                   "(trained before they were reserved); send the prompt without a suffix", "suffix")
    state.engine.check_room(len(prompts))  # full: 429 now, before tokenizing (`submit` checks again)
    if req.suffix:
        ids = [await state.fim_prompt_ids(p, req.suffix) for p in prompts]
    else:
        ids = [await state.prompt_ids(p, param="prompt") for p in prompts]
    new = min(state.new_tokens(req.max_tokens, len(i), "max_tokens", DEFAULT_MAX_TOKENS, prompt_param="prompt")
              for i in ids)
    params = SamplingParams(max_new_tokens=new, n=n, temperature=temperature, top_p=top_p, top_k=max(top_k, 0),
                            seed=req.seed, stop=stops, top_logprobs=logprobs, stream=bool(req.stream),
                            prompt_logprobs=bool(req.echo and req.logprobs is not None))
    return prompts_of(req), ids, params


# ------------------------------------------------------------------------------------------------- answers
def final_text(seq: SequenceResult) -> str:
    """OpenAI cuts the stop sequence away."""
    return seq.text[:seq.stop[0]] if seq.stop else seq.text


def finish_reason(seq: SequenceResult) -> str:
    return "length" if seq.finish_reason == "length" else "stop"


def completion_id() -> str:
    return f"cmpl-{uuid.uuid4().hex}"


def _logprobs(state: ServingState, tokens: list[Token], prompt: list[tuple[int, float | None]], offset: int) -> dict:
    """OpenAI's legacy logprobs object: token strings, their log-probabilities, top alternatives, text offsets."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    pos = offset
    prompt_text = IncrementalDecoder(state.tokenizer)  # a character split over tokens counts once, at its last
    for token_id, lp in prompt:
        out["tokens"].append(state.token_text(token_id))
        out["token_logprobs"].append(lp)
        out["top_logprobs"].append(None)
        out["text_offset"].append(pos)
        pos += len(prompt_text.add(token_id))
    for token in tokens:
        text = state.token_text(token.id)
        out["tokens"].append(text)
        out["token_logprobs"].append(token.logprob)
        out["top_logprobs"].append({state.token_text(i): v for i, v in token.top} if token.top else None)
        out["text_offset"].append(pos)
        pos += len(token.text)
    return out


def completion_answer(state: ServingState, req: CompletionRequest, prompts: list[str],
                      results: list[JobResult]) -> dict:
    """The non-streamed answer: `len(prompts) * n` choices, index = prompt * n + sequence."""
    choices = []
    n = len(results[0].sequences) if results else 1
    for p, (prompt, result) in enumerate(zip(prompts, results)):
        for seq in result.sequences:
            echo = prompt if req.echo else ""
            lp = None
            if req.logprobs is not None:
                prompt_part = []
                if req.echo and result.prompt_logprobs is not None:  # the user's tokens, not the EOS put first
                    prompt_part = list(zip(result.prompt_ids[1:], result.prompt_logprobs[1:]))
                lp = _logprobs(state, seq.tokens, prompt_part, 0)
            choices.append({"index": p * n + seq.index, "text": echo + final_text(seq), "logprobs": lp,
                            "finish_reason": finish_reason(seq)})
    completion = sum(len(seq.tokens) for r in results for seq in r.sequences)
    prompt_tokens = sum(len(r.prompt_ids) for r in results)
    return {"id": completion_id(), "object": "text_completion", "created": int(time.time()),
            "model": state.info.name, "system_fingerprint": None, "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                      "total_tokens": prompt_tokens + completion}}


class CompletionStream:
    """Engine events to OpenAI's completion chunks. A choice's text goes out as soon as it is final: a tail that
    may still become a stop sequence (which would be cut) waits for the next token, or for the choice's end, which
    goes out when that choice ends (its finish_reason with what it held back), not when its request's n do."""

    def __init__(self, state: ServingState, req: CompletionRequest, prompts: list[str], params: SamplingParams):
        self.state = state
        self.req = req
        self.prompts = prompts
        self.n = params.n
        self.stops = params.stop
        self.id = completion_id()
        self.created = int(time.time())
        self.usage = bool(req.stream_options and req.stream_options.include_usage)
        self.text: dict[int, str] = {}  # choice index -> text generated so far (before any cut)
        self.sent: dict[int, int] = {}  # choice index -> characters of it already sent
        self.ended: set[int] = set()  # choice indices whose last chunk was sent
        self.tokens = [0, 0]  # prompt, completion

    def _chunk(self, choices: list[dict], usage: dict | None = None) -> dict:
        out = {"id": self.id, "object": "text_completion", "created": self.created, "model": self.state.info.name,
               "system_fingerprint": None, "choices": choices}
        if self.usage:
            out["usage"] = usage
        return out

    def _choice(self, index: int, text: str, reason: str | None = None) -> dict:
        return {"index": index, "text": text, "logprobs": None, "finish_reason": reason}

    def start(self) -> list[dict]:
        """The prompt, first, when `echo` asks for it."""
        if not self.req.echo:
            return []
        return [self._chunk([self._choice(p * self.n + i, prompt) for i in range(self.n)])
                for p, prompt in enumerate(self.prompts)]

    def token(self, tag: int, seq_index: int, token: Token, ended: SequenceResult | None = None) -> list[dict]:
        """The chunk `token` makes ready, if any; with `ended` (the sequence ends with this token) the choice's last
        chunk: the rest of its text and its finish_reason, at once, whether or not the request's other sequences
        go on (they used to wait for the last of the n)."""
        index = tag * self.n + seq_index
        if ended is not None:
            return [self._end(index, ended)]
        before = self.text.get(index, "")
        text = self.text[index] = before + token.text
        sent = self.sent.get(index, 0)
        ready = len(text)
        if self.stops:
            ready -= held_back(text, self.stops, sent)
            hit = find_stop(text, self.stops, stop_search_start(len(before), self.stops))
            if hit is not None:
                ready = min(ready, hit[0])
        if ready <= sent:
            return []
        self.sent[index] = ready
        return [self._chunk([self._choice(index, text[sent:ready])])]

    def _end(self, index: int, seq: SequenceResult) -> dict:
        """A choice's last chunk: what it held back of its text (cut at the stop string), with its finish_reason."""
        self.ended.add(index)
        return self._chunk([self._choice(index, final_text(seq)[self.sent.get(index, 0):], finish_reason(seq))])

    def done(self, tag: int, result: JobResult) -> list[dict]:
        """The request of prompt `tag` ended: its counts, and the end of any choice not ended yet."""
        self.tokens[0] += len(result.prompt_ids)
        self.tokens[1] += sum(len(seq.tokens) for seq in result.sequences)
        return [self._end(tag * self.n + seq.index, seq) for seq in result.sequences
                if tag * self.n + seq.index not in self.ended]

    def end(self) -> list[dict]:
        if not self.usage:
            return []
        prompt, completion = self.tokens
        return [self._chunk([], {"prompt_tokens": prompt, "completion_tokens": completion,
                                 "total_tokens": prompt + completion})]


def models(state: ServingState, created: int) -> dict:
    return {"object": "list", "data": [{"id": state.info.name, "object": "model", "created": created,
                                        "owned_by": "codeparrot"}]}
