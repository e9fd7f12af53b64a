"""License filter (`preprocess.py --licenses`): which repositories' files may be trained on.

The BigQuery export carries one `license` string per repository: GitHub's license key (licensee's `spdx_id`
lower-cased: "mit", "apache-2.0", "gpl-3.0", ...). The Stack v2 / StarCoder2 keep files under a permissive
license and files with no license; copyleft and commercial licenses are dropped. This module is that rule:

- `PERMISSIVE` below is the allowlist of `--licenses permissive`: the licenses GitHub's detector reports that
  the Blue Oak Council's list of permissive licenses holds (any rating) AND ScanCode's license database categorizes
  as "Permissive" or "Public Domain" (the two sources The Stack v2 combined), written as GitHub's keys.
- MPL-2.0 is NOT on it: ScanCode categorizes it "Copyleft Limited" (file-level copyleft: modified MPL files must
  stay MPL and ship their source), and The Stack v2 dropped the copyleft categories. A user who accepts
  file-level copyleft adds it with their own FILE.
- A record whose `license` is missing, null, empty or one of `NO_LICENSE` ("unknown", which
  `scripts/export_local.py` writes for files it has no license for; "no_license", The Stack v2's own value;
  "none") is "no license" and is kept, as in The Stack v2. GitHub's "other"/"noassertion" (a license file the
  detector could not name) is a license, just not a recognized one: dropped and counted as unrecognized.
- Any other string is not on the allowlist and is dropped, but counted apart by its value, so a spelling the
  list does not know ("MIT License", "other") shows up in stats.json instead of vanishing silently.
- `--licenses FILE`: the user's own allowlist, one license key per line (`#` starts a comment); matched after
  the same normalization (lower-case, surrounding whitespace removed).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from codeparrot.errors import CodeParrotError

# GitHub license keys; each is permissive in Blue Oak Council's list and "Permissive"/"Public Domain" in ScanCode.
PERMISSIVE = frozenset({
    "mit", "mit-0", "apache-2.0", "bsd-2-clause", "bsd-3-clause", "bsd-3-clause-clear", "bsd-4-clause", "0bsd",
    "isc", "zlib", "unlicense", "cc0-1.0", "wtfpl", "bsl-1.0", "ncsa", "postgresql", "upl-1.0", "afl-3.0",
    "ms-pl", "python-2.0", "ecl-2.0",
})
# Keys GitHub reports that are NOT permissive (copyleft or weak copyleft): dropped, counted as "not permissive".
KNOWN_NOT_PERMISSIVE = frozenset({
    "gpl-2.0", "gpl-3.0", "lgpl-2.1", "lgpl-3.0", "agpl-3.0", "mpl-2.0", "epl-1.0", "epl-2.0", "eupl-1.1",
    "eupl-1.2", "osl-3.0", "cecill-2.1", "ms-rl", "artistic-2.0", "lppl-1.3c", "ofl-1.1", "cc-by-sa-4.0",
    "gfdl-1.3", "odbl-1.0", "vim", "mulanpsl-2.0",
})
# `license` values that say "no license information" (kept like a missing field).
NO_LICENSE = frozenset({"", "unknown", "no_license", "none"})
MODES = ("all", "permissive")  # any other --licenses value is a FILE path

DROPPED_NOT_ALLOWED = "license_not_allowed"  # a known license outside the allowlist
DROPPED_UNRECOGNIZED = "license_unrecognized"  # a string the allowlist and the known lists do not hold
MAX_LICENSE_CHARS = 64  # a license value longer than this is truncated in stats.json (it is user data)
MAX_DISTINCT = 200  # distinct license values reported by name; the rarer ones are summed as "(other values)"


def normalize(value: Any) -> str:
    """The comparable form of a `license` field: stripped, lower-case; "" for None/missing/empty."""
    if value is None:
        return ""
    return str(value).strip().lower()


def read_allowlist(path: str | Path) -> frozenset[str]:
    """A user's allowlist file: one license key per line, `#` comments and blank lines ignored."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise CodeParrotError(f"--licenses {path}: not 'all', 'permissive' or a readable allowlist file "
                              f"({type(err).__name__}: {err})") from None
    keys = frozenset(normalize(line.split("#", 1)[0]) for line in lines) - {""}
    if not keys:
        raise CodeParrotError(f"--licenses {path}: the allowlist file names no license")
    return keys


class LicenseFilter:
    """The allowlist decision for one record's `license` field. Picklable (a frozenset)."""

    def __init__(self, spec: str):
        self.spec = spec
        if spec == "all":
            self.allowed = None
        elif spec == "permissive":
            self.allowed = PERMISSIVE
        else:
            self.allowed = read_allowlist(spec)

    @property
    def active(self) -> bool:
        return self.allowed is not None

    def reason(self, value: Any) -> str | None:
        """None to keep the record, else why it is dropped (DROPPED_NOT_ALLOWED or DROPPED_UNRECOGNIZED)."""
        key = normalize(value)
        if self.allowed is None or key in NO_LICENSE or key in self.allowed:
            return None
        if key in KNOWN_NOT_PERMISSIVE or key in PERMISSIVE:  # PERMISSIVE: known, but not on a user's FILE list
            return DROPPED_NOT_ALLOWED
        return DROPPED_UNRECOGNIZED


class LicenseCounts:
    """Every license decision, by normalized value: what stats.json reports under `licenses`. The counters hold
    every distinct value (truncated to MAX_LICENSE_CHARS); the report keeps the MAX_DISTINCT most frequent, so it
    is the same whatever order the decisions were added in (the two engines add them in different orders)."""

    def __init__(self) -> None:
        self.kept: Counter = Counter()
        self.dropped: Counter = Counter()
        self.by_reason: Counter = Counter()

    def add(self, value: Any, reason: str | None, n: int = 1) -> None:
        key = normalize(value)[:MAX_LICENSE_CHARS] or "(none)"
        (self.kept if reason is None else self.dropped)[key] += n
        if reason is not None:
            self.by_reason[reason] += n

    @staticmethod
    def _top(counts: Counter) -> dict[str, int]:
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        out = dict(sorted(ranked[:MAX_DISTINCT]))
        if len(ranked) > MAX_DISTINCT:
            out["(other values)"] = sum(n for _, n in ranked[MAX_DISTINCT:])
        return out

    def as_stats(self) -> dict[str, Any]:
        return {"kept_by_license": self._top(self.kept), "dropped_by_license": self._top(self.dropped),
                "dropped_by_reason": dict(sorted(self.by_reason.items()))}
