"""The README and the pages under docs/ stay true to the repository:

- every relative link (`[text](target)`, `![alt](target)`) resolves to a file or folder next to the page that holds
  it, and every `#anchor` (same page or `page.md#anchor`) is a heading of the target page, slugged as GitHub does;
- the README links every docs page (no page only reachable by searching);
- every command in a fenced code block (```bash, ```sh, ```shell or a plain ```) that runs a project script
  (`python scripts/NAME.py ...`, `accelerate launch ... scripts/NAME.py ...`, `python scripts/launch.py ...
  scripts/NAME.py ...`) parses with that script's own argparse parser (and a launcher's flags with accelerate's
  launcher parser, which is what `scripts/launch.py` parses with). Keys passed on to a config loader
  (`scripts/train.py`'s `--section.key value`, `scripts/initialize_model.py`'s preset fields) are loaded by it.

Commands are read like `tests/tools/test_gpu_commands.py` reads them: backslash continuations joined, a trailing
`# comment` dropped, `[optional part]` tried with and without it (`[a | b]`: without, with a, with b), and ` ...`
(more flags) dropped. Everything runs in-process: each script is imported once and its parser captured by
patching `ArgumentParser.parse_args`/`parse_known_args` while its `main(["--help"])` runs, which also tells
whether it parses strictly or hands the rest to a config loader; nothing but argument parsing happens.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import re
import shlex
import unicodedata
from pathlib import Path
from unittest import mock
from urllib.parse import unquote

import pytest

from ..conftest import REPO_ROOT

DOCS_DIR = REPO_ROOT / "docs"
PAGES = [REPO_ROOT / "README.md", *sorted(DOCS_DIR.rglob("*.md"))]
SHELL_FENCES = {"", "bash", "sh", "shell"}
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)\s*$")
SCRIPT = re.compile(r"^(?:\./)?scripts/(\w+)\.py$")
# Commands that are shown on purpose although they do not parse as written. Keep this tiny: fix the doc instead.
# Entries are (page relative to the repository, a substring of the command).
SKIP: set[tuple[str, str]] = set()


def _rel(path: Path) -> str:
    return path.relative_to(REPO_ROOT).as_posix()


# ---------------------------------------------------------------------------------------------------- markdown


def _split_fences(text: str) -> tuple[list[str], list[tuple[str, int, list[str]]]]:
    """(the page's lines with every fenced block blanked, [(language, line of the block's first line, lines)]).
    A fence may be indented (a code block inside a list item); its indentation is removed from its lines."""
    lines = text.splitlines()
    prose, blocks = list(lines), []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, marker, lang = opening.groups()
        body, j = [], i + 1
        while j < len(lines) and not re.match(rf"^\s*{re.escape(marker[0])}{{{len(marker)},}}\s*$", lines[j]):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        blocks.append((lang.lower(), i + 2, body))
        for k in range(i, min(j + 1, len(lines))):
            prose[k] = ""
        i = j + 1
    return prose, blocks


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: links reduced to their text, lowercase, every character but letters, digits,
    `_`, `-` and spaces removed (backticks and other punctuation included), spaces turned into `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LMN")
    return kept.replace(" ", "-")


@functools.cache
def anchors(path: Path) -> frozenset[str]:
    """Every heading anchor of a markdown page; a repeated heading gets `-1`, `-2`, ... as on GitHub."""
    prose, _ = _split_fences(path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    found = set()
    for line in prose:
        heading = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading is None:
            continue
        base = slug(heading.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every markdown link and image outside code (fenced blocks and inline code spans)."""
    prose, _ = _split_fences(path.read_text(encoding="utf-8"))
    text = "\n".join(prose)
    # inline code spans may hold brackets and parentheses; keep their newlines so line numbers stay right
    text = re.sub(r"(`+)(?:(?!\1).)+?\1", lambda m: "code" + "\n" * m.group(0).count("\n"), text, flags=re.DOTALL)
    found = []
    for match in re.finditer(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^()\s<>]*)>?(?:\s+\"[^\"]*\")?\s*\)", text):
        found.append((text.count("\n", 0, match.start()) + 1, match.group(1)))
    return found


def _link_cases() -> list[tuple[str, int, str]]:
    return [(_rel(page), line, target) for page in PAGES for line, target in links(page)
            if not re.match(r"^(?:[a-z][a-z0-9+.-]*:|//)", target, flags=re.IGNORECASE)]  # http(s), mailto, ...


def test_the_pages_are_found():
    assert REPO_ROOT / "README.md" in PAGES and len(PAGES) > 5
    assert len(_link_cases()) > 20  # the link extraction works at all


@pytest.mark.parametrize("page, line, target", _link_cases(), ids=lambda v: str(v))
def test_relative_link_resolves(page, line, target):
    source = REPO_ROOT / page
    where = f"{page}:{line}: link ({target})"
    file_part, _, anchor = target.partition("#")
    resolved = (source.parent / unquote(file_part)).resolve() if file_part else source
    assert resolved.is_relative_to(REPO_ROOT), f"{where} points outside the repository"
    assert resolved.exists(), f"{where}: {_rel(resolved) if resolved.is_relative_to(REPO_ROOT) else resolved} " \
                              f"does not exist"
    if anchor:
        assert resolved.suffix == ".md", f"{where}: an #anchor into a file that is not markdown"
        assert anchor in anchors(resolved), (f"{where}: no heading of {_rel(resolved)} has the anchor #{anchor} "
                                             f"(its anchors: {sorted(anchors(resolved))})")


def test_the_readme_links_every_docs_page():
    readme = REPO_ROOT / "README.md"
    linked = {(readme.parent / unquote(t.partition("#")[0])).resolve() for _, t in links(readme)}
    orphans = [_rel(p) for p in sorted(DOCS_DIR.glob("*.md")) if p.resolve() not in linked]
    assert not orphans, f"docs pages the README does not link: {orphans}"
    for page in sorted(DOCS_DIR.glob("*.md")):  # and every page leads back
        assert any(t.partition("#")[0] == "../README.md" for _, t in links(page)), \
            f"{_rel(page)} has no link back to ../README.md"


def test_slugs_follow_github():
    assert slug("On a GPU: from a fresh clone to tokens/s and MFU") == "on-a-gpu-from-a-fresh-clone-to-tokenss-and-mfu"
    assert slug("`scripts/human_eval.py`: HumanEval pass@k") == "scriptshuman_evalpy-humaneval-passk"
    assert slug("The [real](x.md) corpus: `--push REPO`") == "the-real-corpus---push-repo"


# ---------------------------------------------------------------------------------------------------- commands


def _variants(command: str) -> list[str]:
    """`cmd [--flag X]` -> without and with the optional part; `[--a X | --b Y]` -> without, with `--a X`, with
    `--b Y`; ` ...` (more flags) dropped. As in test_gpu_commands.py, plus the alternatives."""
    command = re.sub(r"\s\.\.\.(?=\s|$)", " ", command)
    optional = re.search(r"\[([^\[\]]*)\]", command)
    if optional is None:
        return [command]
    before, after = command[:optional.start()], command[optional.end():]
    choices = ["", *(part.strip() for part in optional.group(1).split(" | "))]
    return [variant for choice in choices for variant in _variants(f"{before} {choice} {after}")]


def _shell_lines(block: list[str], first_line: int) -> list[tuple[int, str]]:
    """(line, text) of each logical shell line: continuations joined, trailing `# comments` and comment lines
    dropped."""
    found, buffer, start = [], [], first_line
    for offset, raw in enumerate(block):
        if not buffer:
            start = first_line + offset
        if raw.rstrip().endswith("\\"):
            buffer.append(raw.rstrip()[:-1])
            continue
        buffer.append(raw)
        line = re.sub(r"(?:^|\s+)#(?:\s.*)?$", "", " ".join(part.strip() for part in buffer)).strip()
        buffer = []
        if line:
            found.append((start, line))
    return found


def _segments(line: str) -> list[list[str]]:
    """The simple commands of a shell line (split at `|`, `||`, `&&`, `;`), each without leading VAR=value."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars="|&;")
    lexer.whitespace_split = True
    lexer.commenters = ""
    segments: list[list[str]] = [[]]
    for token in lexer:
        if token and set(token) <= set("|&;"):
            segments.append([])
        else:
            segments[-1].append(token)
    cleaned = []
    for tokens in segments:
        while tokens and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", tokens[0]):
            tokens = tokens[1:]
        if tokens:
            cleaned.append(tokens)
    return cleaned


def _script_runs(tokens: list[str]) -> tuple[list[str] | None, str, list[str]] | None:
    """(launcher flags or None, script name, script flags) of a simple command that runs a project script."""
    if tokens[:2] == ["accelerate", "launch"]:
        launcher = tokens[2:]
    elif len(tokens) > 1 and re.match(r"^(?:\S*/)?python3?$", tokens[0]) and SCRIPT.match(tokens[1]):
        name = SCRIPT.match(tokens[1]).group(1)
        if name != "launch":
            return None, name, tokens[2:]
        launcher = tokens[2:]
    else:
        assert not (re.match(r"^(?:\S*/)?(?:python3?|accelerate|torchrun)$", tokens[0])
                    and any(SCRIPT.match(t) for t in tokens)), \
            f"a command runs a project script in a way this test does not know: {shlex.join(tokens)}"
        return None
    at = next((i for i, t in enumerate(launcher) if SCRIPT.match(t)), None)
    assert at is not None, f"a launch without a project script: {shlex.join(tokens)}"
    return launcher[:at], SCRIPT.match(launcher[at]).group(1), launcher[at + 1:]


def _command_cases() -> list[tuple[str, int, str]]:
    cases = []
    for page in PAGES:
        _, blocks = _split_fences(page.read_text(encoding="utf-8"))
        for lang, first_line, body in blocks:
            if lang not in SHELL_FENCES:
                continue
            for line, text in _shell_lines(body, first_line):
                if re.search(r"scripts/\w+\.py", text) and not any(
                        _rel(page) == skip_page and what in text for skip_page, what in SKIP):
                    cases.append((_rel(page), line, text))
    return cases


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser, method: str):
        super().__init__(method)
        self.parser, self.method = parser, method


@pytest.fixture(scope="module")
def script_parser(load_script):
    """`script_parser(name) -> (parser, "parse_args" | "parse_known_args")`: the parser scripts/NAME.py parses its
    command line with, and the call it makes (parse_known_args: the rest goes to a config loader)."""

    @functools.cache
    def get(name: str):
        if name == "launch":  # scripts/launch.py hands its whole command line to accelerate's launcher parser
            from accelerate.commands.launch import launch_command_parser

            return launch_command_parser(), "parse_args"
        module = load_script(name)  # scripts/train.py has a build_parser(), but main() also says which call it makes

        def capture(method):
            def fake(self, args=None, namespace=None):
                raise _Captured(self, method)
            return fake

        with mock.patch.object(argparse.ArgumentParser, "parse_args", capture("parse_args")), \
                mock.patch.object(argparse.ArgumentParser, "parse_known_args", capture("parse_known_args")), \
                contextlib.redirect_stdout(io.StringIO()):
            try:
                module.main(["--help"])
            except _Captured as captured:
                return captured.parser, captured.method
        raise AssertionError(f"scripts/{name}.py: main(['--help']) returned without parsing a command line")

    return get


def _load_overrides(name: str, namespace: argparse.Namespace, overrides: list[str]) -> None:
    """What a parse_known_args script does with the flags its parser left: they must load as config keys."""
    from codeparrot.config import load_config

    if name == "train":
        from codeparrot.training.config import TrainConfig

        load_config(TrainConfig, REPO_ROOT / namespace.config if namespace.config else None, overrides)
    elif name == "initialize_model":
        from codeparrot.repository.model import ModelConfig

        load_config(ModelConfig, REPO_ROOT / namespace.model_config, overrides)
    else:
        raise AssertionError(f"scripts/{name}.py leaves flags to something this test does not check: {overrides}")


def _parse(parser: argparse.ArgumentParser, method: str, argv: list[str]):
    """Parse like the script would; a parse error is returned as its message (None when the arguments parse)."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            return getattr(parser, method)(argv), None
        except SystemExit as stop:
            if stop.code in (0, None):  # --help
                return None, None
            return None, (err.getvalue().strip().splitlines() or [f"exit status {stop.code}"])[-1]


def test_the_commands_are_found():
    scripts = set()
    for _, _, text in _command_cases():
        for variant in _variants(text):
            for tokens in _segments(variant):
                run = _script_runs(tokens)
                if run is not None:
                    scripts.add(run[1])
    assert {"export_local", "preprocess", "train_tokenizer", "initialize_model", "checkpoints", "pretokenize",
            "train", "validation_loss", "human_eval", "generate", "highlight", "app"} <= scripts, scripts


@pytest.mark.parametrize("page, line, command", _command_cases(), ids=lambda v: str(v)[:60])
def test_documented_command_parses(page, line, command, script_parser):
    from codeparrot.errors import CodeParrotError

    for variant in _variants(command):
        for tokens in _segments(variant):
            run = _script_runs(tokens)
            if run is None:
                continue
            launcher, name, argv = run
            where = f"{page}:{line}: `{command}`" + (f" (as `{shlex.join(tokens)}`)" if variant != command else "")
            assert (REPO_ROOT / "scripts" / f"{name}.py").is_file(), f"{where}: scripts/{name}.py does not exist"
            if launcher is not None:
                parser, method = script_parser("launch")
                _, error = _parse(parser, method, [*launcher, f"scripts/{name}.py", *argv])
                assert error is None, f"{where}: the launcher's flags do not parse: {error}"
            parser, method = script_parser(name)
            parsed, error = _parse(parser, method, argv)
            assert error is None, f"{where}: scripts/{name}.py's parser refuses it: {error}"
            if method == "parse_known_args" and parsed is not None:
                namespace, overrides = parsed
                try:
                    _load_overrides(name, namespace, overrides)
                except CodeParrotError as err:
                    pytest.fail(f"{where}: scripts/{name}.py's config refuses it: {err}")
