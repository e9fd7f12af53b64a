"""One-line reports of other libraries' errors: what `first_line` keeps of a message that spans pages."""

from __future__ import annotations

import pytest

from codeparrot.errors import CodeParrotError, first_line
from codeparrot.tokenizer import load_tokenizer


def test_the_first_non_blank_line_of_a_long_message():
    err = OSError("\n  Can't load tokenizer for 'x'.  \nIf you were trying to load it from the Hub, make sure ...\n")
    assert first_line(err) == "Can't load tokenizer for 'x'."


def test_a_blank_message_falls_back_to_the_type_or_the_given_default():
    assert first_line(KeyError()) == "KeyError"  # never an empty report, never an IndexError
    assert first_line(RuntimeError("  \n "), default="") == ""
    assert first_line("") == ""


def test_a_library_error_becomes_one_line_naming_the_folder(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not json", encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text("{}", encoding="utf-8")
    with pytest.raises(CodeParrotError) as err:
        load_tokenizer(str(tmp_path))
    assert str(err.value).startswith(f"cannot load the tokenizer in {tmp_path}: ") and "\n" not in str(err.value)
