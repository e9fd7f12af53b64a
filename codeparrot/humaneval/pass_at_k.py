"""The unbiased pass@k estimator (Chen et al., 2021) and the tables HumanEval reports.

For one task with n samples of which c pass, the probability that at least one of k samples drawn without
replacement passes is

    pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n-c+1}^{n} (1 - k / i)

The product form never builds the huge binomials (C(200, 100) has 59 digits) and stays accurate in floating
point. pass@k of a benchmark is the mean over tasks. It is defined only for k <= n: a k above some task's
sample count is reported as not computable (value None and a reason), never silently left out. A task
with no samples at all (n = 0, allowed only when the caller opts into partial scoring) counts as failed
(0) in the mean, and every entry says how many such tasks it includes.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Iterable, Mapping, Sequence

# The same estimator as an `evaluate` metric module (sandboxed execution included), loadable offline:
#     evaluate.load(str(METRIC_DIR)).compute(predictions=..., references=..., k=[1, 10])
METRIC_DIR = Path(__file__).resolve().parent / "metric" / "code_eval_sandboxed"


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task: n samples, c of them correct. Raises ValueError unless 0 <= c <= n, 1 <= k <= n."""
    if not (isinstance(n, int) and isinstance(c, int) and isinstance(k, int)):
        raise TypeError(f"n, c, k must be integers, got {n!r}, {c!r}, {k!r}")
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got n={n}")
    if n - c < k:  # every k-subset contains a correct sample
        return 1.0
    prob_all_fail = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_fail *= 1.0 - k / i
    return 1.0 - prob_all_fail


def pass_at_k_exact(n: int, c: int, k: int) -> float:
    """The same quantity with exact integer binomials (slow for large n; the reference in tests)."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_at_k_table(counts: Mapping[str, tuple[int, int]], ks: Iterable[int]) -> dict[str, dict]:
    """{"pass@k": {"value": mean over tasks or None, "reason": why not computable or None, "tasks": n,
    "tasks_without_samples": m}}.

    `counts` maps task id -> (n samples, c correct). A task with n = 0 counts as 0 in the mean (it is one
    of the `tasks`). A k larger than the smallest n > 0 is not computable: the reason names the task with
    the fewest samples.
    """
    table: dict[str, dict] = {}
    sampled = {task: nc for task, nc in counts.items() if nc[0] > 0}
    missing = len(counts) - len(sampled)
    if not sampled:
        for k in ks:
            table[f"pass@{k}"] = {"value": None, "reason": "no samples" if counts else "no tasks",
                                  "tasks": len(counts), "tasks_without_samples": missing}
        return table
    fewest_task, (fewest_n, _) = min(sampled.items(), key=lambda item: (item[1][0], item[0]))
    for k in sorted(set(int(k) for k in ks)):
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        entry = {"value": None, "reason": None, "tasks": len(counts), "tasks_without_samples": missing}
        if k > fewest_n:
            entry["reason"] = f"not computable: {fewest_task} has only {fewest_n} samples (< {k})"
        else:
            values = [pass_at_k(n, c, k) for n, c in sampled.values()]
            entry["value"] = sum(values) / len(counts)  # tasks without samples add 0
        table[f"pass@{k}"] = entry
    return table


def best_per_k(tables: Mapping[str, Mapping[str, dict]]) -> dict[str, dict]:
    """For each pass@k, the best value over temperatures (Codex/CodeParrot report the best T per k).

    `tables` maps a temperature label to a `pass_at_k_table`. Returns {"pass@k": {"value", "temperature"}}
    with value None (and a reason) when no temperature could compute it.
    """
    best: dict[str, dict] = {}
    for label, table in tables.items():
        for key, entry in table.items():
            current = best.get(key)
            if entry["value"] is None:
                if current is None:
                    best[key] = {"value": None, "temperature": None, "reason": entry["reason"]}
                continue
            if current is None or current["value"] is None or entry["value"] > current["value"]:
                best[key] = {"value": entry["value"], "temperature": label, "reason": None}
    return dict(sorted(best.items(), key=lambda item: int(item[0].split("@")[1])))


def format_table(tables: Mapping[str, Mapping[str, dict]], best: Mapping[str, dict] | None = None) -> str:
    """A small text table: one row per temperature (and "best"), one column per pass@k, in percent."""
    keys: Sequence[str] = sorted({k for t in tables.values() for k in t}, key=lambda s: int(s.split("@")[1]))
    rows = [["temperature", *keys]]

    def cell(entry) -> str:
        return "n/a" if entry is None or entry["value"] is None else f"{100 * entry['value']:.2f}%"

    for label, table in tables.items():
        rows.append([str(label), *(cell(table.get(k)) for k in keys)])
    if best is not None and len(tables) > 1:
        rows.append(["best", *(cell(best.get(k)) for k in keys)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    for label, table in tables.items():
        entry = next(iter(table.values()), {})
        if entry.get("tasks_without_samples"):
            lines.append(f"note: temperature {label}: {entry['tasks_without_samples']} of {entry['tasks']} tasks "
                         f"have no samples and count as failed")
    return "\n".join(lines)
