"""The optional data stages as units: license allowlist, secret redaction, encoded-data filter, the near-dedup
keep policy and shingles. (Their wiring into both engines: test_preprocess_stages.py.)"""

from __future__ import annotations

import ast

import numpy as np
import pytest

from codeparrot.data.encoded_data import encoded_data_reason
from codeparrot.data.licenses import (DROPPED_NOT_ALLOWED, DROPPED_UNRECOGNIZED, PERMISSIVE, LicenseCounts,
                                      LicenseFilter)
from codeparrot.data.preprocess_config import STACK_V2, PreprocessConfig, parse_preprocess_config
from codeparrot.data.near_dedup import MinHasher, copies_of, estimated_jaccard, kept_member
from codeparrot.data.secret_redaction import find_secrets, redact
from codeparrot.errors import CodeParrotError
from codeparrot.tools.secret_sample import LOOKALIKE_KINDS, SECRET_KINDS, labelled_sample


# --- licenses -------------------------------------------------------------------------------------------------

def test_permissive_keeps_the_allowlist_and_no_license_and_counts_the_rest():
    f = LicenseFilter("permissive")
    assert [f.reason(v) for v in ("mit", " Apache-2.0 ", "bsd-3-clause", "cc0-1.0", None, "")] == [None] * 6
    # "no license information": export_local.py writes "unknown", The Stack v2 "no_license"; kept like a missing one
    assert [f.reason(v) for v in ("unknown", "Unknown", "no_license", "none")] == [None] * 4
    assert f.reason("noassertion") == DROPPED_UNRECOGNIZED  # a license file GitHub could not name is a license
    assert f.reason("gpl-3.0") == f.reason("agpl-3.0") == DROPPED_NOT_ALLOWED
    assert f.reason("mpl-2.0") == DROPPED_NOT_ALLOWED  # file-level copyleft: not on the default list
    assert f.reason("MIT License") == f.reason("other") == DROPPED_UNRECOGNIZED  # not silently kept
    assert LicenseFilter("all").reason("gpl-3.0") is None
    counts = LicenseCounts()
    for value in ("mit", None, "gpl-3.0", "MIT License"):
        counts.add(value, f.reason(value))
    assert counts.as_stats() == {"kept_by_license": {"(none)": 1, "mit": 1},
                                 "dropped_by_license": {"gpl-3.0": 1, "mit license": 1},
                                 "dropped_by_reason": {DROPPED_NOT_ALLOWED: 1, DROPPED_UNRECOGNIZED: 1}}


def test_the_recipe_never_overrides_a_flag_given_on_the_command_line():
    base = ["--input", "in", "--output-dir", "out", "--recipe", "stack-v2"]
    recipe = parse_preprocess_config(base).with_recipe()
    assert {k: getattr(recipe, k) for k in STACK_V2} == STACK_V2
    # each stage switched off (or set to its CodeParrot default) by name wins, the others stay the recipe's
    cfg = parse_preprocess_config(base + ["--licenses", "all", "--no-redact-secrets", "--jaccard-threshold", "0.85"])
    chosen = cfg.with_recipe()
    assert (chosen.licenses, chosen.redact_secrets, chosen.jaccard_threshold) == ("all", False, 0.85)
    assert chosen.filter_encoded_data and chosen.near_dedup and chosen.shingle_size == 5
    assert parse_preprocess_config(base[:4] + ["--no-near-dedup"]).with_recipe() == PreprocessConfig(
        inputs=["in"], output_dir="out", given=("inputs", "near_dedup", "output_dir"))


def test_user_allowlist_file(tmp_path):
    path = tmp_path / "allow.txt"
    path.write_text("# ours\nMIT\nmpl-2.0  # we accept file-level copyleft\n\n")
    f = LicenseFilter(str(path))
    assert f.reason("mit") is None and f.reason("mpl-2.0") is None
    assert f.reason("apache-2.0") == DROPPED_NOT_ALLOWED  # known and permissive, but not on this list
    assert "mpl-2.0" not in PERMISSIVE
    with pytest.raises(CodeParrotError, match="readable allowlist"):
        LicenseFilter(str(tmp_path / "missing.txt"))
    (tmp_path / "empty.txt").write_text("# nothing\n")
    with pytest.raises(CodeParrotError, match="names no license"):
        LicenseFilter(str(tmp_path / "empty.txt"))


# --- secrets --------------------------------------------------------------------------------------------------

def test_labelled_sample_every_secret_gone_every_lookalike_kept_code_parses():
    sample = labelled_sample(len(SECRET_KINDS) * 2, seed=3)
    assert {p.kind for _, plants in sample for p in plants if p.is_secret} == set(SECRET_KINDS)
    seen_lookalikes = set()
    for text, plants in sample:
        out, kinds = redact(text)
        ast.parse(out)  # placeholders sit inside the string literals
        for p in plants:
            if p.is_secret:
                assert p.value not in out, p.kind
                assert sum(kinds.values()) >= 1
            else:
                seen_lookalikes.add(p.kind)
                assert p.value in out, p.kind
    assert len(seen_lookalikes) == min(len(sample), len(LOOKALIKE_KINDS))


@pytest.mark.parametrize("line, kind, placeholder", [
    ("conn = connect(password='hunter2!Xy9z')", "password_assignment", "<PASSWORD>"),
    ('cfg = {"client_secret": "9f8e7d6c5b4a39281706f5e4"}', "secret_assignment", "<KEY>"),
    ("# contact jane.roe@acme-widgets.io for access", "email", "<EMAIL>"),
    ("SERVER = ('93.184.216.34', 443)", "ip_address", "<IP_ADDRESS>"),
    ("PEER = '2a00:1450:4001:82b::200e'", "ip_address", "<IP_ADDRESS>"),
    ("url = 'https://hooks.slack.com/services/T0ABC1234/B0DEF5678/abcdefghijklmnop12345678'", "slack_webhook",
     "<KEY>"),
])
def test_each_kind_is_replaced_by_its_placeholder(line, kind, placeholder):
    out, kinds = redact(line)
    assert kinds == {kind: 1} and placeholder in out


@pytest.mark.parametrize("line", [
    "__version__ = '4.3.10.1'", "RELEASE = '2.7.2.2'", "see section 8.2.4.45 of the spec",
    "HOST = '127.0.0.1'", "NET = '10.0.0.0'", "MASK = 'ffff:ffff:ffff:ffff::'", "ts = '12:30:45'",
    "x = a@b.T", "@property", "email = 'someone@example.com'", "url = 'git@github.com:org/repo.git'",
    "token = tokenizer.get_token()", "password = getpass.getpass()", "TOKEN_RE = r'[A-Za-z0-9]{32}'",
    "access_key = os.environ['AWS_ACCESS_KEY']", "auth_header = 'Authorization'",
    "checksum = 'd41d8cd98f00b204e9800998ecf8427e'", "__author__ = 'jdoe'",
])
def test_lookalikes_are_left_alone(line):
    assert find_secrets(line) == []


# --- encoded data ---------------------------------------------------------------------------------------------

def test_encoded_data_rule():
    code = "def f(x):\n    return x + 1\n" * 20
    b64 = "".join(chr(65 + (i * 7) % 26) for i in range(1100))
    assert encoded_data_reason(code) is None
    assert encoded_data_reason(code + f"DATA = '{b64}'\n") == "encoded_data:base64"  # one run over 1,024
    hex_bytes = ", ".join(f"0x{i % 256:02x}" for i in range(300))  # 1,798 characters
    assert encoded_data_reason(f"TABLE = [{hex_bytes}]\n") == "encoded_data:hex"
    assert encoded_data_reason("S = '" + "\\u00e9" * 200 + "'\n") == "encoded_data:unicode"
    small = "x = '" + "QUJD" * 20 + "'\n"  # an 80-character base64 run in a short file: most of it
    assert encoded_data_reason(small) == "encoded_data:fraction"
    assert encoded_data_reason(code + small) is None  # the same run in a larger file is fine
    assert encoded_data_reason("") is None


# --- near-dedup keep policy and shingles ------------------------------------------------------------------------

def test_most_copies_then_smallest_row():
    copies = np.array([3, 9, 9, 1, -1])
    cluster = np.array([0, 1, 2, 4])
    assert kept_member(cluster, copies, "first") == 0
    assert kept_member(cluster, copies, "most-copies") == 1  # 9 twice: the smaller row wins
    assert kept_member(np.array([3, 4]), copies, "most-copies") == 3  # a missing count ranks below any count
    assert [copies_of(r) for r in ({"copies": 5}, {"copies": "12"}, {}, {"copies": "x"}, {"copies": -2},
                                   {"copies": True})] == [5, 12, -1, -1, -1, -1]
    # Strings that str.isdigit() accepts but int() does not, and counts past the int64 columns they are kept in
    assert [copies_of(r) for r in ({"copies": "\u00b2"}, {"copies": "\u0663"}, {"copies": "9" * 20},
                                   {"copies": 10**30})] == [-1, -1, 2**63 - 1, 2**63 - 1]


def _ngram_jaccard(a: str, b: str, n: int) -> float:
    ta, tb = a.split(), b.split()
    sa = {tuple(ta[i:i + n]) for i in range(len(ta) - n + 1)}
    sb = {tuple(tb[i:i + n]) for i in range(len(tb) - n + 1)}
    return len(sa & sb) / len(sa | sb)


def test_shingles_estimate_the_ngram_jaccard_and_ignore_batching():
    a = " ".join(f"t{i % 37}" for i in range(300))
    b = " ".join(f"t{i % 37}" if i % 50 else "other" for i in range(300))
    hasher = MinHasher(256, 0, 10, shingle_size=5)
    (sa, sb), valid = hasher.signatures([a, b])
    assert valid.all()
    assert abs(estimated_jaccard(sa, sb) - _ngram_jaccard(a, b, 5)) < 0.1
    assert _ngram_jaccard(a, b, 5) < _ngram_jaccard(a, b, 1)  # 5-grams see the edits that token sets miss
    alone, _ = hasher.signatures([b])
    assert (alone[0] == sb).all()
    with pytest.raises(CodeParrotError, match="shingle_size"):
        MinHasher(256, 0, min_tokens=4, shingle_size=5)


def test_encoded_data_prefilter_changes_no_decision():
    """The cheap pre-checks only skip regexes that cannot match: same reasons as the bare rule on real files and
    on runs in every form (mixed 0x/bare/\\x, wrapped, short of the limits, non-ASCII around)."""
    import random

    from codeparrot.data import encoded_data
    from codeparrot.tools.secret_sample import stdlib_files

    def reference(text):
        covered = 0
        for kind, pattern in encoded_data.PATTERNS.items():
            for m in pattern.finditer(text):
                if m.end() - m.start() > encoded_data.MAX_MATCH_CHARS:
                    return f"encoded_data:{kind}"
                covered += m.end() - m.start()
        return "encoded_data:fraction" if covered > encoded_data.MAX_MATCHED_FRACTION * len(text) else None

    rng = random.Random(0)
    forms = [lambda b: f"0x{b:02x}", lambda b: f"{b:02X}", lambda b: f"\\x{b:02x}"]
    texts = [p.read_text("utf-8", "replace") for p in stdlib_files(40, seed=5)]
    for _ in range(60):
        n = rng.choice([7, 8, 30, 200, 400])
        seps = rng.choice([", ", ",", " ", "\n  ", "", "\u00a0"])
        run = seps.join(rng.choice(forms)(rng.randrange(256)) for _ in range(n))
        b64 = "".join(rng.choice("ABCdef0123+/=") for _ in range(rng.choice([63, 64, 500, 1100])))
        uni = "".join(f"\\u{rng.randrange(65536):04x}" for _ in range(rng.choice([7, 8, 300])))
        filler = "def f():\n    return 'é'\n" * rng.choice([1, 30])
        texts.append(filler + rng.choice([run, b64, uni, run + " " + b64]) + "\n")
    assert [encoded_data_reason(t) for t in texts] == [reference(t) for t in texts]
