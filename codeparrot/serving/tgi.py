"""Text Generation Inference's API: the request schema, its validation into engine settings, and the answers.

The wire format is TGI's (its OpenAPI schema, what `huggingface_hub.InferenceClient`, the `text_generation` client and
llm-ls' `tgi` backend speak): `{"inputs", "parameters": {...}}` in; `{"generated_text", "details"}` out of
`/generate`, the same wrapped in a list out of the compatibility route `/` (what the Hub client and
`text_generation.Client` post to), and server-sent events `{"index", "token", "top_tokens", "generated_text",
"details"}` out of `/generate_stream` (and `/` with `"stream": true`), the last one carrying the whole text and
`details.finish_reason`.

TGI's rules kept: greedy unless `do_sample` or a sampling setting (temperature != 1, top_k, top_p < 1) is given;
`temperature` > 0; a stop sequence stays at the end of the text (finish_reason "stop_sequence"); `best_of` needs
sampling, no seed and no stream; `truncate` keeps the input's last tokens. Differences: without `max_new_tokens` a
request gets what fits (context, --max-new-tokens); the end-of-sequence token is streamed with empty text (and
`special: true`), so the streamed texts join up to exactly `generated_text`; settings this server does not implement
(repetition/frequency penalty, typical_p, watermark, grammar, adapters) are refused with 422 instead of ignored.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from codeparrot.serving.engine import JobResult, SequenceResult, Token
from codeparrot.serving.errors import ApiError
from codeparrot.serving.sampling import SamplingParams
from codeparrot.serving.state import MAX_TOP_LOGPROBS, Bool, Float, Int, ServingState


class TgiParameters(BaseModel):
    """TGI's `GenerateParameters`; unknown keys are ignored, as TGI does."""

    model_config = ConfigDict(extra="ignore")

    adapter_id: str | None = None
    best_of: Int | None = None
    decoder_input_details: Bool = False
    details: Bool = False
    do_sample: Bool = False
    frequency_penalty: Float | None = None
    grammar: Any = None
    max_new_tokens: Int | None = None
    repetition_penalty: Float | None = None
    return_full_text: Bool | None = None
    seed: Int | None = None
    stop: list[str] | None = None
    temperature: Float | None = None
    top_k: Int | None = None
    top_n_tokens: Int | None = None
    top_p: Float | None = None
    truncate: Int | None = None
    typical_p: Float | None = None
    watermark: Bool = False


class TgiRequest(BaseModel):
    """`/generate`, `/generate_stream` and `/` (whose `stream` picks the answer's form)."""

    model_config = ConfigDict(extra="ignore")

    inputs: str
    parameters: TgiParameters = Field(default_factory=TgiParameters)
    stream: Bool = False


def _refuse(what: str, param: str) -> ApiError:
    return ApiError(f"`{param}` {what}", "validation", f"parameters.{param}")


def _unsupported(p: TgiParameters) -> None:
    unsupported = {"repetition_penalty": p.repetition_penalty not in (None, 1.0),
                   "frequency_penalty": p.frequency_penalty not in (None, 0.0),
                   "typical_p": p.typical_p not in (None, 1.0), "watermark": p.watermark,
                   "grammar": p.grammar is not None, "adapter_id": p.adapter_id not in (None, "")}
    for name, given in unsupported.items():
        if given:
            raise _refuse("is not supported by this server (leave it out)", name)


async def to_job(state: ServingState, body: TgiRequest, stream: bool) -> tuple[list[int], SamplingParams]:
    """The prompt ids and engine settings of a TGI request, or a 422 `ApiError` naming the parameter."""
    p = body.parameters
    if not body.inputs:
        raise ApiError("`inputs` cannot be empty", "validation", "inputs")
    _unsupported(p)
    if p.temperature is not None and p.temperature <= 0:
        raise _refuse(f"must be strictly positive, got {p.temperature}", "temperature")
    if p.top_p is not None and not 0 < p.top_p <= 1:
        raise _refuse(f"must be > 0.0 and <= 1.0, got {p.top_p}", "top_p")
    if p.top_k is not None and p.top_k <= 0:
        raise _refuse(f"must be strictly positive, got {p.top_k}", "top_k")
    if p.truncate is not None and not 0 < p.truncate < state.limits.max_input_tokens:
        raise _refuse(f"must be in [1, {state.limits.max_input_tokens - 1}] (--max-input-tokens, with the EOS put "
                      f"first), got {p.truncate}", "truncate")
    if p.seed is not None and not 0 <= p.seed < 2**64:
        raise _refuse(f"must be in [0, 2^64), got {p.seed}", "seed")
    top_n = p.top_n_tokens or 0
    if not 0 <= top_n <= MAX_TOP_LOGPROBS:
        raise _refuse(f"must be in [0, {MAX_TOP_LOGPROBS}], got {top_n}", "top_n_tokens")
    if stream and p.decoder_input_details:
        raise _refuse("is not supported when streaming tokens", "decoder_input_details")
    sampling = p.do_sample or p.temperature not in (None, 1.0) or p.top_p not in (None, 1.0) or bool(p.top_k)
    best_of = p.best_of if p.best_of is not None else 1
    if best_of < 1 or best_of > state.limits.max_n:
        raise _refuse(f"must be in [1, {state.limits.max_n}] (--max-n), got {best_of}", "best_of")
    if best_of > 1 and (not sampling or p.seed is not None or stream):
        raise _refuse("> 1 needs sampling, no seed and no streaming", "best_of")
    stops = state.check_stops(p.stop or [], "parameters.stop")
    state.engine.check_room()  # full: 429 now, before tokenizing (`submit` checks again)
    prompt = await state.prompt_ids(body.inputs, p.truncate)
    new = state.new_tokens(p.max_new_tokens, len(prompt), "max_new_tokens")
    temperature = (p.temperature or 1.0) if sampling else 0.0
    return prompt, SamplingParams(max_new_tokens=new, n=best_of, temperature=temperature, top_p=p.top_p or 1.0,
                                  top_k=p.top_k or 0, seed=p.seed, stop=stops, top_logprobs=top_n,
                                  prompt_logprobs=p.decoder_input_details, stream=stream)


# ------------------------------------------------------------------------------------------------- answers
def final_text(seq: SequenceResult) -> str:
    """TGI keeps the stop sequence: the text ends right after it."""
    return seq.text[:seq.stop[0] + len(seq.stop[1])] if seq.stop else seq.text


def token_json(token: Token, text: str | None = None) -> dict:
    return {"id": token.id, "text": token.text if text is None else text, "logprob": token.logprob,
            "special": token.special}


def _top_json(state: ServingState, token: Token) -> list[dict]:
    return [{"id": i, "text": state.token_text(i), "logprob": lp, "special": i in state.engine.special_ids}
            for i, lp in token.top or []]


def _sequence_details(state: ServingState, p: TgiParameters, seq: SequenceResult, result: JobResult) -> dict:
    prefill = []
    if p.decoder_input_details and result.prompt_logprobs is not None:
        prefill = [{"id": i, "text": state.token_text(i), "logprob": lp}
                   for i, lp in zip(result.prompt_ids, result.prompt_logprobs)]
    out = {"finish_reason": seq.finish_reason, "generated_tokens": len(seq.tokens), "seed": result.seed,
           "prefill": prefill, "tokens": [token_json(t) for t in seq.tokens]}
    if p.top_n_tokens:
        out["top_tokens"] = [_top_json(state, t) for t in seq.tokens]
    return out


def generate_answer(state: ServingState, body: TgiRequest, result: JobResult) -> dict:
    """`/generate`'s answer. With best_of, the sequence of the highest total log-probability is the answer and the
    others are `details.best_of_sequences`."""
    p = body.parameters
    seqs = sorted(result.sequences, key=lambda s: -sum(t.logprob for t in s.tokens))
    best = seqs[0]
    prefix = body.inputs if p.return_full_text else ""
    out: dict = {"generated_text": prefix + final_text(best)}
    if p.details:
        out["details"] = _sequence_details(state, p, best, result)
        if len(seqs) > 1:
            out["details"]["best_of_sequences"] = [
                {"generated_text": prefix + final_text(s), **_sequence_details(state, p, s, result)} for s in seqs[1:]]
    return out


class StreamWriter:
    """Turns one request's engine events into TGI stream events. A token event goes out as soon as its token is
    chosen, but the sequence's last: that one waits for the "done" that follows it in the same engine step, so that
    it carries `generated_text` and `details` and has its text trimmed to end where `generated_text` ends (a stop
    sequence may end inside that token). (Holding every token until the next one existed sent each a step late.)"""

    def __init__(self, state: ServingState, body: TgiRequest, prompt_tokens: int):
        self.state = state
        self.body = body
        self.prompt_tokens = prompt_tokens
        self.sent = ""  # the text of the token events already sent
        self.pending: Token | None = None
        self.index = 0

    def token(self, token: Token, last: bool) -> list[dict]:
        self.pending = token
        return [] if last else self._flush()

    def _flush(self, text: str | None = None, final: dict | None = None) -> list[dict]:
        token, self.pending = self.pending, None
        self.index += 1
        event = {"index": self.index, "token": token_json(token, text), "top_tokens": _top_json(self.state, token),
                 "generated_text": None, "details": None}
        self.sent += event["token"]["text"]
        if final:
            event.update(final)
        return [event]

    def done(self, result: JobResult) -> list[dict]:
        seq = result.sequences[0]
        text = final_text(seq)
        last = text[len(self.sent):] if text.startswith(self.sent) else self.pending.text
        prefix = self.body.inputs if self.body.parameters.return_full_text else ""
        details = {"finish_reason": seq.finish_reason, "generated_tokens": len(seq.tokens), "seed": result.seed,
                   "input_length": self.prompt_tokens}
        return self._flush(last, {"generated_text": prefix + text, "details": details})


def info(state: ServingState) -> dict:
    """`GET /info`: TGI's fields, plus this server's limits and FIM tokens (for editor plugins to read)."""
    from codeparrot import __version__
    from codeparrot.fim import FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX

    limits = state.limits
    return {"model_id": state.info.name, "model_sha": state.info.sha, "model_dtype": state.info.dtype,
            "model_device_type": state.info.device, "model_pipeline_tag": "text-generation",
            "max_concurrent_requests": state.engine.max_requests, "max_best_of": limits.max_n,
            "max_stop_sequences": limits.max_stop_sequences, "max_input_tokens": limits.max_input_tokens,
            "max_input_length": limits.max_input_tokens, "max_total_tokens": limits.context,
            "max_new_tokens": limits.max_new_tokens, "max_batch_size": state.engine.max_batch_size,
            "validation_workers": 1, "max_client_batch_size": limits.max_n, "router": "codeparrot-serve",
            "version": __version__, "sha": None, "docker_label": None,
            "fim": {"prefix": FIM_PREFIX, "suffix": FIM_SUFFIX, "middle": FIM_MIDDLE} if state.info.fim else None}
