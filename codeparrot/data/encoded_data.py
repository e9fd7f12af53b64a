"""Encoded-data filter (`preprocess.py --filter-encoded-data`): StarCoder2's rule for files that are mostly
embedded data (base64 payloads, byte arrays, escaped Unicode blobs) rather than code.

A match is one of (StarCoder2 / The Stack v2's definitions):
- a base64 run: 64 or more characters of `[a-zA-Z0-9+/\\n=]` (newlines included: wrapped base64 is one run);
- a hex byte list: 8 or more hex bytes in a row, each `\\xHH`, or `0xHH`/`HH` standing alone, optionally
  followed by a comma and/or spaces (`0xde, 0xad, ...`, `\\xde\\xad...`, `de ad be ef ...`);
- a Unicode escape run: 8 or more `\\uXXXX` in a row.
A file is dropped when one match is longer than 1,024 characters, or when the matches together cover more than
half of the file's characters. Deterministic (no randomness).
"""

from __future__ import annotations

import re

PATTERNS = {
    "base64": re.compile(r"[a-zA-Z0-9+/\n=]{64,}"),
    # One byte: `\xHH`, or `0xHH`/`HH` standing alone (not inside a longer word), then an optional comma/space.
    # (ASCII whitespace only: what the prefilter below translates.)
    "hex": re.compile(r"(?:(?:\\x|(?<![0-9A-Za-z])(?:0x)?)[0-9a-fA-F]{2}(?![0-9A-Za-z])(?:,\s*|\s+)?){8,}",
                      re.ASCII),
    "unicode": re.compile(r"(?:\\u[0-9a-fA-F]{4}){8,}"),
}
# Cheap necessary conditions, so that a file without any run does not pay for the regexes (each tries a match
# at most positions of ordinary code: about 1 ms per 14 KB file together). On the text's bytes translated to a
# tiny alphabet, a base64 run is 64 "a" in a row; a hex list without `\\x` is 8 two-hex-digit tails separated by
# commas/whitespace ("0x" maps to "hh" as well), which a literal-prefixed regex finds fast.
_B64_CHARS = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+/\n=")
_B64_TABLE = bytes(97 if c in _B64_CHARS else 32 for c in range(256))
_HEX_CHARS = frozenset(b"0123456789abcdefABCDEFx")
_HEX_TABLE = bytes(104 if c in _HEX_CHARS else 32 if c in b" \t\r\n\f\v," else 46 for c in range(256))
_HEX_HINT = re.compile(rb"hh(?: +h*hh){7}")


def _may_match(kind: str, text: str, data: bytes) -> bool:
    if kind == "base64":
        return b"a" * 64 in data.translate(_B64_TABLE)
    if kind == "hex":
        return "\\x" in text or _HEX_HINT.search(data.translate(_HEX_TABLE)) is not None
    return "\\u" in text


MAX_MATCH_CHARS = 1024
MAX_MATCHED_FRACTION = 0.5
REASON = "encoded_data"  # the drop reason in stats.json's `filtered`


def encoded_data_reason(text: str) -> str | None:
    """"encoded_data:KIND" (the kind of the run that decided it) for a file to drop, else None."""
    covered, limit = 0, MAX_MATCHED_FRACTION * len(text)
    data = text.encode("utf-8", "surrogatepass")  # non-ASCII bytes are >= 0x80: outside every run
    for kind, pattern in PATTERNS.items():
        if not _may_match(kind, text, data):
            continue
        for m in pattern.finditer(text):
            size = m.end() - m.start()
            if size > MAX_MATCH_CHARS:
                return f"{REASON}:{kind}"
            covered += size
    # Matches of different kinds may overlap (a hex run is also base64 characters); StarCoder2 sums them as here.
    if covered > limit:
        return f"{REASON}:fraction"
    return None
