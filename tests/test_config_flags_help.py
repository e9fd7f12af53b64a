"""`--help` of a config-driven CLI (codeparrot/config_flags.py) shows a flag's default only when there is one to
show: an empty string or list default (preprocess.py's --input and --output-dir) adds no "(default: )"."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from codeparrot.config import doc
from codeparrot.config_flags import add_flags


@dataclass
class _Flags:
    inputs: list[str] = field(default_factory=list, metadata={"help": "input files"})
    output_dir: str = doc("", "output folder")
    workers: int = doc(2, "worker processes")


def test_empty_defaults_are_not_shown_and_the_parsed_defaults_stay():
    parser = argparse.ArgumentParser()
    add_flags(parser, _Flags)
    text = parser.format_help()
    assert "(default: )" not in text and "(default: 2)" in text
    assert vars(parser.parse_args([])) == {"inputs": [], "output_dir": "", "workers": 2}
