"""Every training command a GPU user is told to run (`make bench`'s GPU list, the code blocks of the README and of
docs/*.md) loads:
scripts/train.py's own argument parser, then the config loader and the token budget for the launch's process
count, exactly as the script would before training. A command that fails here would fail at once on the GPU."""

from __future__ import annotations

import re
import shlex

import pytest
import yaml

from codeparrot.config import load_config
from codeparrot.tools.bench import GPU_COMMANDS
from codeparrot.training.config import TrainConfig

from ..conftest import REPO_ROOT


def _variants(command: str) -> list[str]:
    """`cmd [--compile true]` -> with and without the optional part; `...` (more flags) dropped."""
    command = command.replace(" ...", " ")
    optional = re.search(r"\[([^\[\]]*)\]", command)
    if optional is None:
        return [command]
    return [*_variants(command[:optional.start()] + command[optional.end():]),
            *_variants(command[:optional.start()] + optional.group(1) + command[optional.end():])]


def _readme_commands() -> list[tuple[str, str]]:
    """(page, shell line) for the lines (continuations joined) of the fenced code blocks of README.md and
    docs/*.md that run scripts/train.py."""
    lines = []
    for page in [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]:
        blocks, block = [], None  # the shell blocks: ```bash, ```sh, ```shell or a plain ``` (not ```text)
        for line in page.read_text(encoding="utf-8").splitlines():
            fence = re.match(r"^\s*```\s*(\w*)\s*$", line)
            if fence and block is None:
                block = [] if fence.group(1) in ("", "bash", "sh", "shell") else False
            elif fence:
                if block is not False:
                    blocks.append("\n".join(block))
                block = None
            elif block is not None and block is not False:
                block.append(line)
        for text in blocks:
            for line in text.replace("\\\n", " ").splitlines():
                line = re.sub(r"\s+#\s.*$", "", line).strip()  # a trailing comment
                if "scripts/train.py" in line and "--help" not in line:
                    lines.append((page.relative_to(REPO_ROOT).as_posix(), line))
    return lines


def _train_commands() -> list[tuple[str, str]]:
    found = [(f"bench: {what}", cmd) for what, cmd in GPU_COMMANDS if "scripts/train.py" in cmd]
    found += _readme_commands()
    return [(where, variant) for where, cmd in found for part in cmd.split(";") if "scripts/train.py" in part
            for variant in _variants(part.strip())]


def _processes(launcher: list[str]) -> int:
    """--num_processes of the launch, else the one in its --config_file, else 1."""
    if "--num_processes" in launcher:
        return int(launcher[launcher.index("--num_processes") + 1])
    if "--config_file" in launcher:
        cfg = yaml.safe_load((REPO_ROOT / launcher[launcher.index("--config_file") + 1]).read_text())
        return int(cfg.get("num_processes", 1))
    return 1


def test_the_printed_commands_include_the_gpu_path():
    commands = _train_commands()
    assert sum(where.startswith("bench") for where, _ in commands) >= 3
    for page in ("README.md", "docs/gpu.md"):  # the GPU quick path in the README, the whole path in docs/gpu.md
        assert any("--mixed_precision bf16" in cmd and "codeparrot-small.yaml" in cmd and "gpu_data/" in cmd
                   for where, cmd in commands if where == page), page
    assert {where for where, _ in commands} >= {"README.md", "docs/gpu.md", "docs/training.md"}
    assert GPU_COMMANDS[0][1] == "python scripts/gpu_check.py (make gpu-check)"


@pytest.mark.parametrize("where, command", _train_commands())
def test_printed_training_command_loads(where, command, load_script):
    argv = shlex.split(command)
    at = argv.index("scripts/train.py")
    args, overrides = load_script("train").build_parser().parse_known_args(argv[at + 1:])
    cfg = load_config(TrainConfig, REPO_ROOT / args.config if args.config else None, overrides)
    cfg.accumulation_steps(_processes(argv[:at]))  # the token budget divides on that many processes
    if where.startswith("bench"):  # what the GPU figures are measured with
        assert cfg.model == "gpu_data/model-repo" and cfg.data.train == "gpu_data/tokens/train"
        assert cfg.schedule.warmup_steps < cfg.max_steps


def test_gpu_data_builds_the_small_model_from_site_packages(tmp_path):
    """`make gpu-data` = the demo's data stages on this interpreter's site-packages (one repository per package)
    with the codeparrot-small preset, into the folders the GPU commands name."""
    import sysconfig

    from codeparrot.errors import CodeParrotError
    from codeparrot.tools.gpu_data import GpuDataConfig, gpu_data_stages

    stages = {s.name: s for s in gpu_data_stages(GpuDataConfig(), tmp_path / "gpu_data")}
    assert list(stages) == ["export", "preprocess", "tokenizer", "initialize", "filter-tokens", "pretokenize"]
    export = stages["export"].command
    assert sysconfig.get_paths()["purelib"] in export and "--repo-per-subfolder" in export
    init = stages["initialize"].command
    assert init[init.index("--model-config") + 1] == str(REPO_ROOT / "configs/model/codeparrot-small.yaml")
    assert init[init.index("--repo") + 1] == str(tmp_path / "gpu_data" / "model-repo")
    assert stages["pretokenize"].outputs == [tmp_path / "gpu_data/tokens/train", tmp_path / "gpu_data/tokens/valid"]
    with pytest.raises(CodeParrotError, match="not a folder"):
        GpuDataConfig(sources=[str(tmp_path / "missing")]).validate()
