"""Secret and personal-data redaction (`preprocess.py --redact-secrets`): API keys, tokens, passwords, email
addresses and IP addresses in a file's text are replaced by placeholders before the file is written.

What is replaced, and by what (each kind is counted in stats.json's `redacted`; the values never leave here):
- `<KEY>`: cloud and service credentials recognized by their documented formats: AWS access key ids
  (AKIA/ASIA...), Google API keys (AIza...), GitHub tokens (ghp_/gho_/ghu_/ghs_/ghr_, github_pat_), GitLab
  (glpat-), Slack tokens (xox?-) and webhooks, Hugging Face tokens (hf_ + 34 letters), OpenAI, Stripe live keys,
  PyPI and npm tokens, JSON Web Tokens, Azure storage account keys, and PEM private key blocks (the whole
  BEGIN...END block); plus a high-entropy string literal assigned to a name saying secret/token/key/auth/
  credential (`AWS_SECRET = "..."`, `"api_key": "..."`).
- `<PASSWORD>`: such a literal assigned to a name saying password/passwd/pwd, and the password of a URL with
  credentials (`scheme://user:PASSWORD@host`).
- `<EMAIL>`: email addresses, except reserved example domains (RFC 2606/6761: example.com/.org/.net, *.example,
  *.test, *.invalid, *.localhost) and `git@host` SSH remotes.
- `<IP_ADDRESS>`: IPv4/IPv6 addresses that are globally routable (`ipaddress.is_global`), so 127.0.0.1,
  10.x, 192.168.x, 0.0.0.0, multicast and the documentation ranges stay; a dotted quad that reads as a version
  or a section number (a line mentioning version/release/section/spec/RFC, two leading one-digit parts as in
  "2.7.2.2", or inside a longer dotted run or identifier) is not an address.
Only the secret part is replaced, inside its string literal, so redacted code still parses.

Why hand-written patterns and not detect-secrets (measured by codeparrot/tools/benchmarks/data_stages.py on a
labelled sample of planted secrets and look-alikes in real stdlib code, `codeparrot.tools.secret_sample`; figures
in docs/benchmarks.md): detect-secrets' line-by-line scan with all its plugins costs tens of times more per file and
misses kinds of secret that ours finds, its entropy plugins flag hashes in tests and
long identifiers, and it does not cover emails, private IPs vs public ones or Hugging Face tokens. The formats above
follow the same vendors' documented prefixes its plugins use.

Speed: every pattern is guarded by a cheap substring test ("AKIA" in text, "@" in text, ...), and the
keyword rule only looks at lines holding a keyword, so a typical file costs a few substring scans.
"""

from __future__ import annotations

import ipaddress
import math
import re
import string
from collections import Counter

KEY, PASSWORD, EMAIL, IP_ADDRESS = "<KEY>", "<PASSWORD>", "<EMAIL>", "<IP_ADDRESS>"

# kind -> (substrings of which one must occur for the pattern to run, pattern, placeholder); group "s" (or the
# whole match) is the secret that is replaced.
_TOKEN_PATTERNS: dict[str, tuple[tuple[str, ...], re.Pattern, str]] = {
    "private_key": (("PRIVATE KEY",), re.compile(
        r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----.*?-----END[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----", re.S),
        KEY),
    "aws_access_key_id": (("AKIA", "ASIA", "ABIA", "ACCA"), re.compile(r"\b(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}\b"),
                          KEY),
    "google_api_key": (("AIza",), re.compile(r"\bAIza[0-9A-Za-z_\-]{35}(?![0-9A-Za-z_\-])"), KEY),
    "github_token": (("gh", "github_pat_"), re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_\w{82})\b"),
                     KEY),
    "gitlab_token": (("glpat-",), re.compile(r"\bglpat-[0-9A-Za-z_\-]{20}(?![0-9A-Za-z_\-])"), KEY),
    "slack_token": (("xox",), re.compile(r"\bxox[abposr]-[0-9A-Za-z\-]{10,}"), KEY),
    "slack_webhook": (("hooks.slack.com",), re.compile(
        r"(?<=hooks\.slack\.com/services/)(?P<s>T[0-9A-Za-z_]+/B[0-9A-Za-z_]+/[0-9A-Za-z_]+)"), KEY),
    "huggingface_token": (("hf_", "api_org_"), re.compile(r"\b(?:hf_[A-Za-z]{34}|api_org_[A-Za-z]{34})\b"), KEY),
    "openai_key": (("sk-",), re.compile(r"\bsk-(?:proj-)?[A-Za-z0-9_\-]{20,}T3BlbkFJ[A-Za-z0-9_\-]{20,}"), KEY),
    "stripe_key": (("_live_",), re.compile(r"\b[rsp]k_live_[0-9A-Za-z]{24,}\b"), KEY),
    "pypi_token": (("pypi-",), re.compile(r"\bpypi-AgE[A-Za-z0-9_\-]{50,}"), KEY),
    "npm_token": (("npm_",), re.compile(r"\bnpm_[A-Za-z0-9]{36}\b"), KEY),
    "jwt": (("eyJ",), re.compile(r"\beyJ[A-Za-z0-9_\-]{10,}\.eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}"), KEY),
    "azure_storage_key": (("AccountKey=",), re.compile(r"(?<=AccountKey=)(?P<s>[A-Za-z0-9+/]{86}==)"), KEY),
    "url_password": (("://",), re.compile(r"(?<=://)[^\s/:@'\"`]{1,64}:(?P<s>[^\s/@'\"`]{1,128})@[\w.\-]+"),
                     PASSWORD),
}

# The keyword rule: NAME = "VALUE", NAME: "VALUE", "NAME": "VALUE", NAME="VALUE" (keyword arguments), on lines
# holding one of these (lower-cased) substrings; found with `str.find` on the lower-cased text (a case-insensitive
# regex alternation scans 50x slower).
KEYWORDS = ("passw", "pwd", "secret", "token", "apikey", "api_key", "access_key", "accesskey", "private_key", "auth",
            "credential")
_KEYWORD_NAME = re.compile("|".join(KEYWORDS).replace("_", "[_-]?"), re.I)
_ASSIGNMENT = re.compile(
    r"(?P<name>[A-Za-z_][A-Za-z0-9_\-]*)['\"]?\s*(?::=|=|:)\s*[rbuRBU]?(?P<q>['\"])(?P<s>[^'\"\\\s]{8,256})(?P=q)")
_PASSWORD_NAME = re.compile(r"pass|pwd", re.I)
# Not a credential: template/regex/format syntax, a path of 2+ segments ("/etc/app/key.pem"; a base64 key may start
# with "/" but rarely has no "+" and another "/"), a dotted module name, or a masked example ("sk-xxxx").
_PLACEHOLDER_VALUE = re.compile(r"[{}<>$%\[\]()|^]|^(?:/|\./|~/)[\w.\-]+(?:/[\w.\-]+)+$|^(?:[a-z]+\.)+[a-z_]+$|"
                                r"xxxx|XXXX|\*\*\*|\.\.\.")
_WORDS = re.compile(r"[A-Za-z]+(?:[\-_.][A-Za-z]+)*$")  # "X-Session-Token", "SECRET_KEY": names, not secrets
MIN_ENTROPY_BITS = 3.0  # per character; English words and snake_case names are below, random keys above

# Emails and IPs: a fast regex that starts with a literal finds the candidates ("@", ".d.d.d", ":h:h:"), then the
# full pattern is matched from the start of the candidate's run (a leading character class would be tried at
# every position of the text: 20-50x slower).
_EMAIL = re.compile(r"(?P<local>[A-Za-z0-9._%+\-]{1,64})@(?P<domain>(?:[A-Za-z0-9\-]{1,63}\.)+[A-Za-z]{2,24})\b")
_EMAIL_LOCAL_CHARS = frozenset(string.ascii_letters + string.digits + "._%+-")
_EXAMPLE_DOMAINS = re.compile(r"(?:^|\.)(?:example\.(?:com|org|net)|example|test|invalid|localhost)$", re.I)
_IPV4_HINT = re.compile(r"\.\d{1,3}\.\d{1,3}\.\d")
_IPV4 = re.compile(r"(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(?!\w|\.\d)")
_IPV6_HINT = re.compile(r":[0-9A-Fa-f]{0,4}:[0-9A-Fa-f]{0,4}:")
_IPV6 = re.compile(r"(?:[0-9A-Fa-f]{1,4}:){2,7}(?::|(?::[0-9A-Fa-f]{1,4}){1,6}|[0-9A-Fa-f]{1,4})(?![\w:])|"
                   r"::(?:[0-9A-Fa-f]{1,4}:){0,6}[0-9A-Fa-f]{1,4}(?![\w:])")
_HEX_COLON = frozenset(string.hexdigits + ":")
_DIGITS_DOT = frozenset(string.digits + ".")
# A dotted quad on such a line is a version or a document section, not an address.
_NOT_ADDRESS_CONTEXT = re.compile(r"version|release|section|spec\b|rfc|in-addr|oid", re.I)


def shannon_entropy(value: str) -> float:
    """Bits per character of `value`'s character distribution."""
    counts = Counter(value)
    n = len(value)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


def _secret_value(value: str) -> bool:
    """A literal that looks like a real credential: no template, regex or path syntax, not words joined by
    separators (a credential has a digit or a symbol), and high entropy (random, not language)."""
    if _PLACEHOLDER_VALUE.search(value) or _WORDS.match(value):
        return False
    return shannon_entropy(value) >= MIN_ENTROPY_BITS


def _line_bounds(text: str, pos: int) -> tuple[int, int]:
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    return start, len(text) if end < 0 else end


def find_secrets(text: str) -> list[tuple[int, int, str, str]]:
    """Spans to replace: sorted, non-overlapping (start, end, kind, placeholder)."""
    spans: list[tuple[int, int, str, str]] = []
    for kind, (needles, pattern, placeholder) in _TOKEN_PATTERNS.items():
        if any(n in text for n in needles):
            for m in pattern.finditer(text):
                g = "s" if "s" in pattern.groupindex else 0
                spans.append((m.start(g), m.end(g), kind, placeholder))
    spans += _keyword_assignments(text)
    if "@" in text:
        spans += _emails(text)
    spans += _ip_addresses(text)
    return _non_overlapping(spans)


def _keyword_assignments(text: str) -> list[tuple[int, int, str, str]]:
    lower = text.lower()
    line_starts: set[int] = set()
    for word in KEYWORDS:
        pos = lower.find(word)
        while pos >= 0:
            start, end = _line_bounds(lower, pos)
            line_starts.add(start)
            pos = lower.find(word, end)
    spans = []
    for start in sorted(line_starts):
        for m in _ASSIGNMENT.finditer(text, start, _line_bounds(text, start)[1]):
            name = m["name"]
            if _KEYWORD_NAME.search(name) and "author" not in name.lower() and _secret_value(m["s"]):
                password = _PASSWORD_NAME.search(name) is not None
                spans.append((m.start("s"), m.end("s"), "password_assignment" if password else "secret_assignment",
                              PASSWORD if password else KEY))
    return spans


def _run_start(text: str, pos: int, chars: frozenset, limit: int) -> int:
    """The first position of the run of `chars` that ends just before `pos` (at most `limit` back)."""
    start = pos
    while start > 0 and pos - start < limit and text[start - 1] in chars:
        start -= 1
    return start


def _emails(text: str) -> list[tuple[int, int, str, str]]:
    spans, pos = [], text.find("@")
    while pos >= 0:
        start = _run_start(text, pos, _EMAIL_LOCAL_CHARS, 64)
        m = _EMAIL.match(text, start) if start < pos else None
        if m and m.end("local") == pos and not _EXAMPLE_DOMAINS.search(m["domain"]) and m["local"] != "git":
            spans.append((m.start(), m.end(), "email", EMAIL))
        pos = text.find("@", pos + 1)
    return spans


def _ip_addresses(text: str) -> list[tuple[int, int, str, str]]:
    spans = []
    for hint, pattern, chars in ((_IPV4_HINT, _IPV4, _DIGITS_DOT), (_IPV6_HINT, _IPV6, _HEX_COLON)):
        done = -1
        for h in hint.finditer(text):
            if h.start() < done:
                continue
            start = _run_start(text, h.start(), chars, 40)
            if start > 0 and (text[start - 1].isalnum() or text[start - 1] in "_."):
                done = h.end()
                continue  # inside an identifier or a longer dotted run
            m = pattern.match(text, start)
            if m and _public_ip(text, m):
                spans.append((m.start(), m.end(), "ip_address", IP_ADDRESS))
            done = m.end() if m else h.end()
    return spans


def _public_ip(text: str, m: re.Match) -> bool:
    try:
        address = ipaddress.ip_address(m.group())
    except ValueError:
        return False
    if not address.is_global or address.is_multicast or m.group().lower().startswith("ffff:"):
        return False  # private, loopback, documentation, multicast ranges; IPv6 netmasks
    if address.version == 6:
        return True
    # "2.7.2.2", "8.2.4.45": two leading one-digit parts read as a version or a section number (the public
    # addresses this skips, 1.1.x.x, 8.8.x.x, 9.9.9.9, are well-known resolvers, not personal data).
    parts = m.group().split(".")
    start, end = _line_bounds(text, m.start())
    return not ((len(parts[0]) == 1 and len(parts[1]) == 1) or _NOT_ADDRESS_CONTEXT.search(text, start, end))


def _non_overlapping(spans: list[tuple[int, int, str, str]]) -> list[tuple[int, int, str, str]]:
    """Earliest start first, the longer span on a tie; a span overlapping an accepted one is dropped."""
    out: list[tuple[int, int, str, str]] = []
    for span in sorted(spans, key=lambda s: (s[0], -s[1])):
        if not out or span[0] >= out[-1][1]:
            out.append(span)
    return out


def redact(text: str) -> tuple[str, Counter]:
    """(text with every span of `find_secrets` replaced by its placeholder, Counter of kinds replaced)."""
    spans = find_secrets(text)
    if not spans:
        return text, Counter()
    parts, pos = [], 0
    for start, end, _, placeholder in spans:
        parts.append(text[pos:start])
        parts.append(placeholder)
        pos = end
    parts.append(text[pos:])
    return "".join(parts), Counter(kind for _, _, kind, _ in spans)
