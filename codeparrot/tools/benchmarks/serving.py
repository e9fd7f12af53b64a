"""The completion server under concurrent clients: requests/s and p50/p95 latency with 1, 4 and 8 clients, continuous
batching side by side with the same server handling one request at a time (`--max-batch-size 1`).

Each server is `scripts/serve.py` in its own process (the `tiny` preset with random weights and a 4,096-token BPE,
one torch thread), so the load generator in this process does not share its interpreter. The load generator is
closed-loop and bounded: `clients` threads on loopback, each sending its share of a fixed number of requests one
after the other (HumanEval prompts, greedy, a fixed `max_new_tokens`: random weights rarely end early, so every
request costs about the same), each with a timeout. Latency is the client's: request sent to whole answer read.
Goal (issue 31): at 8 clients at least 4x the one-at-a-time throughput, with a p95 latency no worse than 2x the
single-client p95.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from codeparrot.tools.benchmarks.common import BenchRow

CLIENTS = (1, 4, 8)
REPO_ROOT = Path(__file__).resolve().parents[3]


@dataclass
class LoadResult:
    requests: int
    seconds: float
    latencies: list[float] = field(default_factory=list)  # seconds, one per answered request
    errors: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return len(self.latencies) / max(self.seconds, 1e-9)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation between the closest ranks."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    low = int(k)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (k - low)


def post_json(url: str, body: dict, timeout: float = 120.0, headers: dict | None = None) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return json.loads(answer.read())


def run_load(url: str, clients: int, total_requests: int, payloads: list[dict], timeout: float = 120.0,
             headers: dict | None = None) -> LoadResult:
    """`total_requests` POSTs of `payloads` (round-robin) to `url` from `clients` threads, each sending its share
    one after the other; the wall time from the first send to the last answer."""
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    shares = [list(range(c, total_requests, clients)) for c in range(clients)]

    def client(indices: list[int]) -> None:
        for i in indices:
            start = time.perf_counter()
            try:
                post_json(url, payloads[i % len(payloads)], timeout, headers)
            except Exception as err:  # noqa: BLE001 - counted and reported, never hides the other requests
                with lock:
                    errors.append(f"{type(err).__name__}: {err}")
                continue
            with lock:
                latencies.append(time.perf_counter() - start)

    threads = [threading.Thread(target=client, args=(share,), daemon=True) for share in shares]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout * (total_requests + 1))
    return LoadResult(total_requests, time.perf_counter() - start, latencies, errors)


def _tiny_model(folder: Path, quick: bool) -> Path:
    from codeparrot.repository.model import build_model, load_model_config, to_gpt2_config
    from codeparrot.tokenizer import train_tokenizer
    from codeparrot.tools.benchmarks.loader import stdlib_texts

    tokenizer = train_tokenizer(stdlib_texts(20 if quick else 100), vocab_size=512 if quick else 4096,
                                show_progress=False)
    preset = REPO_ROOT / "configs" / "model" / "tiny.yaml"
    model = build_model(to_gpt2_config(load_model_config(str(preset)), tokenizer), seed=0).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@contextmanager
def serving(model: Path, batch: int) -> Iterator[str]:
    """scripts/serve.py on a free loopback port with `--max-batch-size batch`; yields its URL, SIGTERMs it."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, str(REPO_ROOT / "scripts" / "serve.py"), "--model", str(model),
                             "--device", "cpu", "--port", "0", "--threads", "1", "--log-level", "warning",
                             "--max-batch-size", str(batch)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=REPO_ROOT)
    try:
        line = proc.stdout.readline()
        if " at http://" not in line:
            raise RuntimeError(f"the server did not start: {line.strip() or proc.stderr.read()[-500:]}")
        yield line.split(" at ", 1)[1].split()[0]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def measure(urls: dict[str, str], payloads: list[dict], total: int, repeats: int) -> dict[str, dict[int, list]]:
    """{server label: {clients: one LoadResult per repeat}}. The servers take turns at each level and repeat (both
    run all along, the idle one costs nothing), so a change in the machine's load hits them alike."""
    for url in urls.values():  # warm-up: a request per prompt
        run_load(url + "/generate", 1, len(payloads), payloads)
    out: dict[str, dict[int, list]] = {label: {c: [] for c in CLIENTS} for label in urls}
    for _ in range(repeats):
        for c in CLIENTS:
            for label, url in urls.items():
                out[label][c].append(run_load(url + "/generate", c, total, payloads))
    return out


def _summary(results: list[LoadResult]) -> tuple[float, float, float, float, float, list[str]]:
    rates = [r.rate for r in results]
    latencies = [x for r in results for x in r.latencies]
    errors = [e for r in results for e in r.errors]
    return (statistics.median(rates), min(rates), max(rates), percentile(latencies, 50) * 1000,
            percentile(latencies, 95) * 1000, errors)


def rows(quick: bool = False) -> list[BenchRow]:
    from codeparrot.humaneval.problems import load_problems

    new_tokens, total, repeats = (8, 8, 1) if quick else (64, 24, 3)
    payloads = [{"inputs": p["prompt"], "parameters": {"max_new_tokens": new_tokens}} for p in load_problems()[:8]]
    with tempfile.TemporaryDirectory() as tmp:
        model = _tiny_model(Path(tmp), quick)
        with serving(model, 16) as batched, serving(model, 1) as single:
            runs = measure({"continuous batching": batched, "one request at a time": single}, payloads, total,
                           repeats)
    measured = {label: {c: _summary(r) for c, r in by_clients.items()} for label, by_clients in runs.items()}
    setting = (f"tiny preset, random weights, 1 torch thread; {total} requests of {new_tokens} new tokens per run "
               f"(HumanEval prompts, greedy), closed loop on loopback")
    out = []
    for c in CLIENTS:
        for label in measured:
            med, low, high, p50, p95, errors = measured[label][c]
            note = f"p50 {p50:,.0f} ms, p95 {p95:,.0f} ms"
            if label == "continuous batching":
                base = measured["one request at a time"][c][0]
                note += f"; {med / base:.1f}x one at a time"
            if c == 8 and label == "continuous batching":
                single_p95 = measured[label][1][4]
                note += (f"; goal >= 4x throughput and p95 <= 2x the 1-client p95 ({p95 / single_p95:.1f}x): "
                         f"{'met' if med / base >= 4 and p95 <= 2 * single_p95 else 'NOT met'}")
            if c == 1 and label == "continuous batching":
                note += f"; {setting}"
            if errors:
                note += f"; {len(errors)} failed request(s), first: {errors[0][:120]}"
            out.append(BenchRow(f"serving: {c} client{'s' if c > 1 else ''}, {label}", "requests/s", med, low, high,
                                repeats, note))
    return out
