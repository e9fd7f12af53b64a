"""scripts/serve.py's flags (ServeConfig): values that would start a server that misbehaves later are refused at
start with one line naming the flag."""

from __future__ import annotations

import pytest

from codeparrot.config_flags import parse_config
from codeparrot.errors import CodeParrotError
from codeparrot.serving.config import ServeConfig


@pytest.mark.parametrize("flags, message", [
    # NaN and inf passed `< 0`; the server started and then crashed on SIGTERM (engine.close's thread join)
    (["--shutdown-timeout", "nan"], "--shutdown-timeout: expected a finite number, got nan"),
    (["--shutdown-timeout", "inf"], "--shutdown-timeout: expected a finite number, got inf"),
    (["--header-timeout", "inf"], "--header-timeout: expected a finite number, got inf"),
    (["--shutdown-timeout", "1e10"], "--shutdown-timeout must be >= 0 and at most 604800 s (a week), got 1e+10"),
    (["--body-timeout", "1e7"], "--body-timeout must be positive and at most 604800 s (a week), got 1e+07"),
    # 0 was silently the default; the flags are left out for that
    (["--threads", "0"], "--threads must be at least 1 (leave it out for torch's choice), got 0"),
    (["--max-input-tokens", "0"], "--max-input-tokens must be at least 2"),
    (["--max-input-tokens", "1"], "--max-input-tokens must be at least 2"),
])
def test_bad_serving_values_are_one_line_errors(flags, message):
    with pytest.raises(CodeParrotError) as err:
        parse_config(ServeConfig, ["--model", "m", *flags])
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_the_limits_themselves_are_accepted():
    cfg = parse_config(ServeConfig, ["--model", "m", "--threads", "1", "--max-input-tokens", "2",
                                     "--shutdown-timeout", "0", "--header-timeout", "604800"])
    assert (cfg.threads, cfg.max_input_tokens, cfg.shutdown_timeout, cfg.header_timeout) == (1, 2, 0.0, 604800.0)
    assert parse_config(ServeConfig, ["--model", "m"]).threads is None  # left out: torch's own choice
