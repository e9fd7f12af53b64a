"""The engine: one thread owns the model and decodes every running request together, one token per step.

Continuous batching: between two decoding steps, finished and cancelled sequences leave the batch and waiting
requests join it (after their prefill; on a GPU the prompts that arrived together share one forward), so a short
request never waits for a long one and a new one waits at most one step. The batch is
`codeparrot.serving.kv_batch.KVBatch`; tokens are chosen per request by `codeparrot.serving.sampling.TokenChooser`;
text, stop strings and streamed pieces come from `codeparrot.serving.text`. Why not transformers' own continuous
batching (`generate_batch`, its manager): measured on the CPU with the tiny preset, its paged-attention loop ran
13-16 tokens/s where `generate` one request at a time ran 54-74 and this loop 313-356 with 8 requests
(docs/serving.md), and its sampling draws from one random stream for the whole batch, so a request's samples would
depend on its batch-mates.

Bounds, all checked when a request is submitted (in the caller's thread, so the answer is immediate; `check_room`
tells a caller beforehand, before it tokenizes a prompt for nothing):
at most `max_requests` requests waiting or running (more: "overloaded", HTTP 429), at most `max_batch_size`
sequences in a step (a request of n sequences waits until n rows are free; the queue is first come, first
served, so a large request is not overtaken forever), and every request fits the model's context.

Requests talk to the caller through a listener, `listener(event)`, called from the engine thread:
`("token", sequence_index, Token, ended)` for each generated token when the request streams (`ended`: the
sequence's `SequenceResult` when it ends with this token, else None; so a stream can send every other token at once,
and end each of a request's n sequences when it ends, not when the last of them does), then exactly one of
`("done", JobResult)` or `("error", ApiError)`. A cancelled request (its client left) leaves the batch at the
next step. A failing forward fails the requests it carried ("generation", HTTP 424/500), never the engine: the batch
is emptied and the next requests run.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import torch

from codeparrot.errors import first_line
from codeparrot.repository.model import model_context
from codeparrot.serving.errors import ApiError
from codeparrot.serving.kv_batch import KVBatch
from codeparrot.serving.sampling import SamplingParams, TokenChooser
from codeparrot.serving.text import IncrementalDecoder, find_stop, stop_search_start

log = logging.getLogger("codeparrot.serving")


@dataclass
class Token:
    """One generated token: its id, the text it added (maybe "" inside a character), its log-probability under
    the model, whether it is special (EOS, a FIM sentinel), and the top alternatives [(id, logprob)] if asked."""

    id: int
    text: str
    logprob: float
    special: bool
    top: list[tuple[int, float]] | None = None


@dataclass
class SequenceResult:
    """One finished sequence. `text` is the decoded generated text (special tokens skipped), whole: the API
    layer cuts it at `stop` (offset, string) its own way. finish_reason: "length", "eos_token", "stop_sequence"."""

    index: int
    tokens: list[Token]
    text: str
    finish_reason: str
    stop: tuple[int, str] | None = None


@dataclass
class JobResult:
    sequences: list[SequenceResult]
    prompt_ids: list[int]
    seed: int | None  # the seed sampling used (None for greedy)
    prompt_logprobs: list[float | None] | None = None  # per prompt token (the first has none), when asked


Event = tuple
Listener = Callable[[Event], None]


@dataclass
class _Sequence:
    index: int
    decoder: IncrementalDecoder
    tokens: list[Token] = field(default_factory=list)
    finish_reason: str | None = None
    stop: tuple[int, str] | None = None
    result: SequenceResult | None = None  # once it ended


class Job:
    """A submitted request: its prompt ids, its settings, where its events go; `cancel()` from any thread."""

    def __init__(self, prompt_ids: list[int], params: SamplingParams, listener: Listener):
        self.prompt_ids = prompt_ids
        self.params = params
        self.listener = listener
        self.cancelled = False
        self.chooser: TokenChooser | None = None
        self.sequences: list[_Sequence] = []
        self.prompt_logprobs: list[float | None] | None = None
        self.running = 0  # sequences not finished
        self.ended = False  # its "done" or "error" event was sent

    def emit(self, event: Event) -> None:
        """Send `event` to the listener; nothing after the job's end ("done" or "error"), which comes once."""
        if self.ended:
            return
        self.ended = event[0] in ("done", "error")
        try:
            self.listener(event)
        except Exception:  # noqa: BLE001 - a listener whose client is gone must never stop the engine
            log.debug("listener failed", exc_info=True)


def _distinct_jobs(rows: list[tuple[Job, _Sequence]]) -> list[Job]:
    """The requests of batch rows (a request with n sequences holds n rows), each once, in row order."""
    return list({id(job): job for job, _ in rows}.values())


class Engine:
    """Continuous batching over one model. `start()`, then `submit()` from any thread; `close()` to stop."""

    def __init__(self, model, tokenizer, max_batch_size: int = 16, max_requests: int = 128,
                 end_token_ids: tuple[int, ...] | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.context = model_context(model)
        self.max_batch_size = max_batch_size
        self.max_requests = max_requests
        # A sequence ends at EOS or at any FIM sentinel (a completion never holds one: codeparrot/fim).
        self.end_ids = frozenset(end_token_ids if end_token_ids is not None else (tokenizer.eos_token_id,))
        self.special_ids = frozenset(tokenizer.all_special_ids) | self.end_ids
        self.batch = KVBatch(model)
        # Prompts that arrive together share one (left-padded) prefill on a GPU, where it saves kernel launches. On
        # the CPU a prefill is compute-bound: 8 HumanEval prompts together cost what 8 alone do, plus the padding to
        # the longest, so each runs alone there, unpadded, as generate runs it.
        self.group_prefill = self.device.type != "cpu"
        self._rows: list[tuple[Job, _Sequence]] = []  # batch row i carries sequence _rows[i]
        self._admitted: list[Job] = []  # taken from the queue this iteration, not yet in _rows (engine thread only)
        self._waiting: deque[Job] = deque()
        self._jobs = 0  # waiting + running
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.failure: str | None = None  # set if the engine thread itself died (a bug): /health reports it
        self.counts = {"completed": 0, "cancelled": 0, "failed": 0, "steps": 0, "largest_batch": 0}

    # ------------------------------------------------------------------------------------------ caller side
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="codeparrot-engine", daemon=True)
        self._thread.start()

    def submit(self, prompt_ids: list[int], params: SamplingParams, listener: Listener) -> Job:
        """Queue a request, or raise `ApiError` (overloaded, too large, shutting down) at once."""
        if not prompt_ids:
            raise ApiError("the prompt is empty", "validation")
        if len(prompt_ids) + params.max_new_tokens > self.context:
            raise ApiError(f"the prompt is {len(prompt_ids)} tokens; with {params.max_new_tokens} new tokens that "
                           f"exceeds the model's context of {self.context} tokens", "validation")
        if params.n > self.max_batch_size:
            raise ApiError(f"{params.n} sequences in one request; this server runs at most {self.max_batch_size} "
                           "at once", "validation")
        job = Job(list(prompt_ids), params, listener)
        with self._cond:
            self._check_room(1)
            self._jobs += 1
            self._waiting.append(job)
            self._cond.notify()
        return job

    def check_room(self, requests: int = 1) -> None:
        """Raise the `ApiError` that `submit` would raise now for `requests` more requests (overloaded, shutting
        down): what a route asks before tokenizing (up to a megabyte of prompt), so that a flood is refused for the
        price of a lock. `submit` still decides; a request may find the room gone by then."""
        with self._cond:
            self._check_room(requests)

    def _check_room(self, requests: int) -> None:  # with the lock held
        if self._closed or self.failure:
            raise ApiError("the server is shutting down" if self._closed else f"the engine stopped: {self.failure}",
                           "unavailable")
        if self._jobs + requests > self.max_requests:
            needs = f", and this request's prompts need {requests}" if requests > 1 else ""
            raise ApiError(f"Model is overloaded: {self._jobs} requests are waiting or running (the limit is "
                           f"{self.max_requests}{needs}); retry later", "overloaded")

    def cancel(self, job: Job) -> None:
        """Drop `job` (its client went away). A waiting one leaves the queue now: only the queue's head was ever
        looked at, so one behind a request waiting for rows kept its place against `max_requests` (429s for live
        clients) until that one started. A running one leaves the batch before the next step."""
        with self._cond:
            job.cancelled = True
            waiting = job in self._waiting
            if waiting:  # counted out in the same lock as it leaves: _fail_all may reset the count any time after
                self._waiting.remove(job)
                self._jobs -= 1
                self.counts["cancelled"] += 1
            self._cond.notify()
        if waiting:
            job.emit(("error", ApiError("the request was cancelled", "unavailable")))

    def close(self, timeout: float | None = 10.0) -> None:
        """Stop: requests still waiting or running end with an "unavailable" error; the thread is joined."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    def stats(self) -> dict:
        with self._cond:
            running = {id(job) for job, _ in self._rows}
            return {"waiting": len(self._waiting), "running_requests": len(running),
                    "running_sequences": len(self._rows), "requests": self._jobs, **self.counts}

    # ------------------------------------------------------------------------------------------ engine side
    def _run(self) -> None:
        try:
            with torch.inference_mode():
                while self._iterate():
                    pass
        except BaseException as err:  # a bug in this loop: fail everything, and say so on /health
            log.exception("the serving engine stopped")
            self.failure = f"{type(err).__name__}: {err}"
            self._fail_all(ApiError(f"the engine stopped: {self.failure}", "generation"))

    def _iterate(self) -> bool:
        with self._cond:
            while not (self._waiting or self._rows or self._closed):
                self._cond.wait()
            closed = self._closed
            admitted = [] if closed else self._admit()
            self._admitted = admitted  # ended by _fail_all too, should this iteration fail
        if closed:
            self._fail_all(ApiError("the server is shutting down; the request was cancelled", "unavailable"))
            return False
        self._drop_cancelled()
        for job in admitted:
            if job.cancelled:
                self._finish_cancelled(job)
        starting = [job for job in admitted if not job.cancelled]
        # With `group_prefill` the prompts that arrived together share one prefill; a request that asks for its
        # prompt's log-probabilities needs every position's logits, so it runs alone.
        together = self.group_prefill
        groups = [[job] for job in starting if job.params.prompt_logprobs or not together]
        groups += [[job for job in starting if together and not job.params.prompt_logprobs]]
        parts, joining = [], []
        for group in groups:
            if group:
                part = self._start(group)
                if part is not None:
                    parts.append(part[0])
                    joining += part[1]
        if parts:  # one copy of the batch for all the requests that join at this step
            try:
                self.batch.add(parts)
            except Exception as err:  # noqa: BLE001 - out of memory growing the batch: the joiners fail, not it
                self._fail(_distinct_jobs(joining), err)
            else:
                self._rows = self._rows + joining  # a new list: stats() reads it from other threads
                self.counts["largest_batch"] = max(self.counts["largest_batch"], len(self._rows))
        self._admitted = []
        if self._rows:
            self._step()
        return True

    def _admit(self) -> list[Job]:
        """Waiting requests that fit the batch now, first come first served (called with the lock held)."""
        admitted, rows = [], len(self._rows)
        while self._waiting:  # never a cancelled one: cancel() takes it out
            job = self._waiting[0]
            if rows + job.params.n > self.max_batch_size:
                break
            self._waiting.popleft()
            admitted.append(job)
            rows += job.params.n
        return admitted

    def _start(self, jobs: list[Job]):
        """Prefill `jobs` together (each prompt n times, as generate expands it) and choose their first tokens.
        Returns ((cache, mask) of the sequences still running, [(job, sequence)] for each of them, in row order), or
        None when none is running."""
        prompts = [job.prompt_ids for job in jobs for _ in range(job.params.n)]
        try:
            logits, cache, mask, prompt_logits = self.batch.prefill(prompts, jobs[0].params.prompt_logprobs)
        except Exception as err:  # noqa: BLE001 - e.g. out of memory: these requests fail, the engine goes on
            self._fail(jobs, err)
            return None
        keep, joining, row = [], [], 0
        for job in jobs:
            n = job.params.n
            job.chooser = TokenChooser(job.params, self.device)
            # special tokens kept as text: an end id never reaches the decoder (serving/text.py)
            job.sequences = [_Sequence(i, IncrementalDecoder(self.tokenizer, skip_special_tokens=False))
                             for i in range(n)]
            job.running = n
            if prompt_logits is not None:  # a group of one (see _iterate)
                logp = torch.log_softmax(prompt_logits[:-1], dim=-1)
                targets = torch.tensor(job.prompt_ids[1:], device=logp.device)[:, None]
                job.prompt_logprobs = [None] + logp.gather(1, targets)[:, 0].tolist()
            try:
                alive = self._advance(job, logits[row:row + n], list(range(n)))
            except Exception as err:  # noqa: BLE001 - e.g. NaN logits: this request fails, its batch-mates go on
                self._fail([job], err)
                alive = []
            for i in alive:
                keep.append(row + i)
                joining.append((job, job.sequences[i]))
            row += n
        if not keep:
            return None
        if len(keep) < row:
            index = torch.tensor(keep, device=self.device)
            cache.batch_select_indices(index)
            mask = mask[index]
        return (cache, mask), joining

    def _step(self) -> None:
        rows = self._rows
        try:
            logits = self.batch.step([seq.tokens[-1].id for _, seq in rows])
        except Exception as err:  # noqa: BLE001 - fail the requests of this batch, keep serving the next ones
            self._fail_batch(err)
            return
        self.counts["steps"] += 1
        keep: list[int] = []
        start = 0
        while start < len(rows):  # a request's rows are adjacent: they joined together, and leaving keeps order
            job = rows[start][0]
            end = start
            while end < len(rows) and rows[end][0] is job:
                end += 1
            try:
                alive = set(self._advance(job, logits[start:end], [seq.index for _, seq in rows[start:end]]))
            except Exception as err:  # noqa: BLE001 - e.g. NaN logits: this request fails, its batch-mates go on
                self._fail([job], err)
                alive = set()
            keep += [k for k in range(start, end) if rows[k][1].index in alive]
            start = end
        self._keep_rows(rows, keep)

    def _keep_rows(self, rows: list, keep: list[int]) -> None:
        """Shrink the batch to rows `keep` of `rows`; should that fail (out of memory copying the cache), the
        requests still running fail and the engine goes on with an empty batch."""
        self._rows = [rows[k] for k in keep]
        try:
            self.batch.keep(keep)
        except Exception as err:  # noqa: BLE001
            self._fail_batch(err)

    def _fail_batch(self, err: Exception) -> None:
        """Fail every request in the batch with `err` and empty it; the engine goes on with the next ones."""
        running = _distinct_jobs(self._rows)
        self._rows = []
        self.batch.clear()
        self._fail(running, err)

    def _advance(self, job: Job, logits: torch.Tensor, indices: list[int]) -> list[int]:
        """Choose and record the next token of `job`'s sequences `indices` (rows of `logits`); returns the indices
        still running, and completes the job when none of its sequences is."""
        params = job.params
        chosen = job.chooser.choose(logits, indices)
        logp = torch.log_softmax(logits, dim=-1)
        picked = logp.gather(1, torch.tensor(chosen, device=logp.device)[:, None])[:, 0].tolist()
        tops = None
        if params.top_logprobs:
            values, ids = logp.topk(params.top_logprobs, dim=-1)
            tops = [list(zip(i, v)) for i, v in zip(ids.tolist(), values.tolist())]
        alive = []
        for row, (index, token_id) in enumerate(zip(indices, chosen)):
            seq = job.sequences[index]
            special = token_id in self.special_ids
            text = ""
            if token_id in self.end_ids:
                seq.finish_reason = "eos_token"
            else:
                before = len(seq.decoder.text)
                text = seq.decoder.add(token_id)
                if text and params.stop:
                    hit = find_stop(seq.decoder.text, params.stop, stop_search_start(before, params.stop))
                    if hit is not None:
                        seq.finish_reason, seq.stop = "stop_sequence", hit
            token = Token(token_id, text, picked[row], special, tops[row] if tops else None)
            seq.tokens.append(token)
            if seq.finish_reason is None and len(seq.tokens) >= params.max_new_tokens:
                seq.finish_reason = "length"
            if seq.finish_reason is None:
                alive.append(index)
            else:
                job.running -= 1
                seq.result = SequenceResult(index, seq.tokens, seq.decoder.full_text(), seq.finish_reason, seq.stop)
            if params.stream:
                job.emit(("token", index, token, seq.result))
        if job.running == 0:
            self._complete(job)
        return alive

    def _complete(self, job: Job) -> None:
        result = JobResult([s.result for s in job.sequences], job.prompt_ids, job.chooser.seed, job.prompt_logprobs)
        with self._cond:
            self._jobs -= 1
            self.counts["completed"] += 1
        job.emit(("done", result))

    def _drop_cancelled(self) -> None:
        if not any(job.cancelled for job, _ in self._rows):
            return
        gone = [job for job in _distinct_jobs(self._rows) if job.cancelled]
        self._keep_rows(self._rows, [k for k, (job, _) in enumerate(self._rows) if not job.cancelled])
        for job in gone:
            self._finish_cancelled(job)

    def _finish_cancelled(self, job: Job) -> None:
        with self._cond:
            self._jobs -= 1
            self.counts["cancelled"] += 1
        job.emit(("error", ApiError("the request was cancelled", "unavailable")))

    def _fail(self, jobs: list[Job], err: Exception) -> None:
        log.error("generation failed for %d request(s)", len(jobs), exc_info=err)
        first = first_line(err, "")[:200]
        error = ApiError(f"generation failed: {type(err).__name__}" + (f": {first}" if first else ""), "generation")
        for job in jobs:
            with self._cond:
                self._jobs -= 1
                self.counts["failed"] += 1
            job.emit(("error", error))

    def _fail_all(self, error: ApiError) -> None:
        """End every waiting and running request with `error` (shutdown, or the engine's own failure)."""
        jobs = _distinct_jobs(self._rows) + self._admitted  # the admitted: out of the queue, not yet in the batch
        self._rows, self._admitted = [], []
        self.batch.clear()
        with self._cond:
            jobs += list(self._waiting)
            self._waiting.clear()
            self._jobs = 0
        for job in jobs:
            job.emit(("error", error))
