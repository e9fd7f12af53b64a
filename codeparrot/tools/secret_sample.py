"""A labelled sample for secret redaction: real standard-library files with planted secrets of every kind
(random values in each vendor's documented format, JWTs well-formed, generated from a seed: never real
credentials) and planted look-alikes
that must stay (hashes in tests, version strings, example and private addresses, placeholder keys).

Each plant is one top-level statement inserted before a top-level `def`/`class`/`import` line (or appended), so
the file still parses; `labelled_sample` returns the files with what was planted where, for
`codeparrot/tools/benchmarks/data_stages.py` (precision/recall and cost) and the tests.
"""

from __future__ import annotations

import ast
import base64
import json
import random
import string
import sysconfig
from dataclasses import dataclass
from pathlib import Path

_ALNUM = string.ascii_letters + string.digits
_B64 = _ALNUM + "+/"


@dataclass(frozen=True)
class Plant:
    kind: str  # e.g. "github_token", or "lookalike:sha256"
    statement: str  # the inserted line(s)
    value: str  # the part that must be gone (a secret) or must stay (a look-alike)

    @property
    def is_secret(self) -> bool:
        return not self.kind.startswith("lookalike:")


def _rand(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def _global_ipv4(rng: random.Random) -> str:
    import ipaddress

    while True:
        ip = ".".join(str(rng.randint(1, 223)) for _ in range(4))
        if ipaddress.ip_address(ip).is_global:
            return ip


def _jwt(rng: random.Random) -> str:
    """A well-formed JSON Web Token (base64url JSON header and claims, random signature)."""
    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).decode().rstrip("=")

    claims = {"sub": _rand(rng, string.digits, 10), "name": _rand(rng, string.ascii_lowercase, 8),
              "iat": rng.randint(1_500_000_000, 1_700_000_000)}
    return ".".join([b64(b'{"alg":"HS256","typ":"JWT"}'), b64(json.dumps(claims).encode()),
                     b64(bytes(rng.randrange(256) for _ in range(32)))])


def _secret(kind: str, rng: random.Random) -> Plant:
    r = lambda alphabet, n: _rand(rng, alphabet, n)  # noqa: E731
    upper_digits = string.ascii_uppercase + string.digits
    values = {
        "aws_access_key_id": ("AWS_ACCESS_KEY_ID = '{v}'", "AKIA" + r(upper_digits, 16)),
        "aws_secret_key": ("aws_secret_access_key = '{v}'", r(_B64, 40)),
        "github_token": ("GITHUB_TOKEN = \"{v}\"", "ghp_" + r(_ALNUM, 36)),
        "slack_token": ("slack_client = SlackClient('{v}')",
                        f"xoxb-{r(string.digits, 12)}-{r(string.digits, 13)}-{r(_ALNUM, 24)}"),
        "huggingface_token": ("login(token=\"{v}\")", "hf_" + r(string.ascii_letters, 34)),
        "google_api_key": ("MAPS_KEY = '{v}'", "AIza" + r(_ALNUM + "_-", 35)),
        "stripe_key": ("stripe_api_key = \"{v}\"", "sk_live_" + r(_ALNUM, 24)),
        "jwt": ("HEADERS = {{'Authorization': 'Bearer {v}'}}", _jwt(rng)),
        "private_key": ("PRIVATE_KEY = '''-----BEGIN RSA PRIVATE KEY-----\n{v}\n-----END RSA PRIVATE KEY-----'''",
                        "\n".join(r(_B64, 64) for _ in range(6))),
        "password_assignment": ("db_password = \"{v}\"", r(_ALNUM, 10) + rng.choice("!#&*") + r(string.digits, 2)),
        "secret_assignment": ("SETTINGS = {{'api_key': '{v}', 'debug': False}}", r("0123456789abcdef", 32)),
        "url_password": ("DATABASE_URL = 'postgres://admin:{v}@db.acme-corp.io/prod'", r(_ALNUM, 14)),
        "email": ("__maintainer__ = '{v}'", f"{r(string.ascii_lowercase, 6)}.{r(string.ascii_lowercase, 7)}"
                                            f"@{r(string.ascii_lowercase, 8)}.com"),
        "ip_address": ("UPSTREAM_HOST = '{v}'", _global_ipv4(rng)),
    }
    template, value = values[kind]
    return Plant(kind, template.format(v=value), value)


def _lookalike(kind: str, rng: random.Random) -> Plant:
    r = lambda alphabet, n: _rand(rng, alphabet, n)  # noqa: E731
    values = {
        "sha256": ("EXPECTED_SHA256 = '{v}'", r("0123456789abcdef", 64)),
        "sha1_in_test": ("assert digest == '{v}'", r("0123456789abcdef", 40)),
        "uuid": ("REQUEST_ID = '{v}'", f"{r('0123456789abcdef', 8)}-{r('0123456789abcdef', 4)}-4"
                                      f"{r('0123456789abcdef', 3)}-a{r('0123456789abcdef', 3)}-"
                                      f"{r('0123456789abcdef', 12)}"),
        "version": ("__version__ = '{v}'", f"{rng.randint(1, 9)}.{rng.randint(0, 30)}.{rng.randint(0, 30)}."
                                           f"{rng.randint(1, 99)}"),
        "loopback": ("HOST = '{v}'", "127.0.0.1"),
        "any_address": ("BIND = '{v}'", "0.0.0.0"),
        "private_ip": ("GATEWAY = '{v}'", f"192.168.{rng.randint(0, 255)}.{rng.randint(1, 254)}"),
        "documentation_ip": ("EXAMPLE_PEER = '{v}'", f"203.0.113.{rng.randint(1, 254)}"),
        "example_email": ("CONTACT = '{v}'", rng.choice(["user@example.com", "noreply@example.org",
                                                          "admin@test.example"])),
        "env_lookup": ("password = os.environ['{v}']", "DB_PASSWORD"),
        "setting_name": ("SECRET_KEY_SETTING = '{v}'", "SECRET_KEY"),
        "header_name": ("token_header = '{v}'", "X-Session-Token"),
        "placeholder": ("api_key = '{v}'", rng.choice(["YOUR_API_KEY", "<your-token>", "sk-xxxxxxxxxxxxxxxx"])),
        "git_remote": ("REMOTE = '{v}'", "git@github.com:org/repo.git"),
        "template": ("password = '{v}'", "{password}"),
        "format_string": ("token_url = '{v}'", "https://%s/oauth/token"),
    }
    template, value = values[kind]
    return Plant("lookalike:" + kind, template.format(v=value), value)


SECRET_KINDS = ("aws_access_key_id", "aws_secret_key", "github_token", "slack_token", "huggingface_token",
                "google_api_key", "stripe_key", "jwt", "private_key", "password_assignment", "secret_assignment",
                "url_password", "email", "ip_address")
LOOKALIKE_KINDS = ("sha256", "sha1_in_test", "uuid", "version", "loopback", "any_address", "private_ip",
                   "documentation_ip", "example_email", "env_lookup", "setting_name", "header_name", "placeholder",
                   "git_remote", "template", "format_string")


def stdlib_files(limit: int, seed: int = 0) -> list[Path]:
    """`limit` standard-library .py files (test suites excluded: they hold deliberate oddities), a seeded choice."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "test" not in p.parts and "site-packages" not in p.parts
                   and p.stat().st_size < 200_000)
    return random.Random(seed).sample(files, min(limit, len(files)))


def plant(text: str, plants: list[Plant], rng: random.Random) -> str:
    """`text` with each plant's statement inserted before a random top-level def/class/import line."""
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    for p in plants:
        future = max((i for i, line in enumerate(lines) if line.startswith("from __future__")), default=-1)
        spots = [i for i, line in enumerate(lines) if i > future and line.startswith(("def ", "class ", "import "))]
        at = rng.choice(spots) if spots else len(lines)
        lines.insert(at, p.statement + "\n")
    return "".join(lines)


def labelled_sample(num_files: int = 200, seed: int = 0) -> list[tuple[str, list[Plant]]]:
    """(planted text, plants) per file: every file gets one secret and one look-alike, kinds in rotation."""
    rng = random.Random(seed)
    out = []
    for path in stdlib_files(num_files, seed):
        text = path.read_text(encoding="utf-8", errors="replace")
        try:
            ast.parse(text)
        except (SyntaxError, ValueError):  # lib2to3's Python 2 fixtures and the like: not usable as "real code"
            continue
        plants = [_secret(SECRET_KINDS[len(out) % len(SECRET_KINDS)], rng),
                  _lookalike(LOOKALIKE_KINDS[len(out) % len(LOOKALIKE_KINDS)], rng)]
        out.append((plant(text, plants, rng), plants))
    return out
