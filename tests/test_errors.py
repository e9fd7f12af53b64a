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


def test_ctrl_c_that_a_library_turned_into_another_error_is_still_interrupted(capsys):
    """Ctrl-C inside numpy's lazy import of a submodule, while transformers loads a model class, ended as
    transformers' ModuleNotFoundError (from a RecursionError, the KeyboardInterrupt lost): a traceback, status 1.
    After a SIGINT, run_cli reports any such error as the interrupt; without one, a bug keeps its traceback."""
    import os
    import signal

    from codeparrot.errors import run_cli

    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # what a script starts with

    def mangled() -> int:
        try:
            os.kill(os.getpid(), signal.SIGINT)  # handled before the next line runs
        except KeyboardInterrupt:
            raise ModuleNotFoundError("Could not import module 'GPT2LMHeadModel'") from RecursionError()
        return 0

    with pytest.raises(SystemExit) as stop:
        run_cli(mangled)
    assert stop.value.code == 130 and capsys.readouterr().err == "interrupted\n"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

    def bug() -> int:
        raise ModuleNotFoundError("a real one")

    try:
        with pytest.raises(ModuleNotFoundError):
            run_cli(bug)
    finally:
        signal.signal(signal.SIGINT, before)


class _Refusing(__import__("torch").utils.data.IterableDataset):
    def __iter__(self):
        raise CodeParrotError("/data/tokens.bin: token id 70000 at token offset 3 is not below the vocabulary size")


def test_an_error_raised_in_a_dataloader_worker_is_reported_as_its_own_line():
    """torch re-raises a worker's CodeParrotError with the worker's whole traceback as its message: the CLI's
    `error:` line used to be that traceback (training reads its data in DataLoader workers by default)."""
    from torch.utils.data import DataLoader

    from codeparrot.errors import error_message

    with pytest.raises(CodeParrotError) as err:
        next(iter(DataLoader(_Refusing(), num_workers=1)))
    assert "Traceback" in str(err.value)  # what torch made of it
    assert error_message(err.value) == ("/data/tokens.bin: token id 70000 at token offset 3 is not below the "
                                        "vocabulary size")
    plain = CodeParrotError("Caught nothing: a user's message that merely starts so")
    assert error_message(plain) == str(plain)
