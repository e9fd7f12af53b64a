"""scripts/preprocess.py's flags (PreprocessConfig): values that would run wrongly are refused before any work."""

from __future__ import annotations

import pytest

from codeparrot.data.preprocess_config import parse_preprocess_config
from codeparrot.errors import CodeParrotError


@pytest.mark.parametrize("flags, message", [
    # NaN passed `< 0` and then switched the stall watchdog off without a word
    (["--stall-minutes", "nan"], "--stall-minutes: expected a finite number, got nan"),
    (["--stall-minutes", "inf"], "--stall-minutes: expected a finite number, got inf"),
    # past what faulthandler's backstop timer takes (an OverflowError once the run had started)
    (["--stall-minutes", "1e9"], "--stall-minutes must be in [0, 10080] (0 = off), got 1000000000.0"),
    (["--valid-fraction", "nan"], "--valid-fraction: expected a finite number, got nan"),
    (["--jaccard-threshold", "nan"], "--jaccard-threshold: expected a finite number, got nan"),
    (["--mean-line-length", "inf"], "--mean-line-length: expected a finite number, got inf"),
])
def test_bad_preprocess_values_are_one_line_errors(flags, message):
    with pytest.raises(CodeParrotError) as err:
        parse_preprocess_config(["--input", "in.jsonl", "--output-dir", "out", *flags])
    assert str(err.value) == message


def test_the_stall_limits_themselves_are_accepted():
    for minutes in ("0", "10080"):
        cfg = parse_preprocess_config(["--input", "in.jsonl", "--output-dir", "out", "--stall-minutes", minutes])
        assert cfg.stall_minutes == float(minutes)
