"""`make install`: the torch request (TORCH, CUDA, TORCH_INDEX) reaches pip, and a changed request reinstalls torch.

Dry runs (`make -n`) against a throw-away virtualenv folder: the pip command lines make would run, without
downloading anything. The torch step's own decision (does the installed torch meet the request?) is
`codeparrot/tools/torch_request.py`, tested directly."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from codeparrot.tools.torch_request import below_floor, satisfies

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")


def _dry_run(repo_root, venv, *assignments: str) -> list[str]:
    done = subprocess.run(["make", "-n", "install", f"VENV={venv}", *assignments], cwd=repo_root,
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.splitlines()


def _torch_install(lines: list[str]) -> str:
    (line,) = [x for x in lines if "pip install" in x and '"torch' in x]
    return " ".join(line.split())


@pytest.fixture
def venv(tmp_path):
    """A virtualenv folder as make sees it (bin/python exists), empty otherwise."""
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").touch()
    return tmp_path / "venv"


def test_cuda_request_uses_pytorchs_cuda_index_and_never_the_local_cpu_wheels(repo_root, venv):
    line = _torch_install(_dry_run(repo_root, venv, "CUDA=cu126"))
    assert line.endswith('pip install --quiet --index-url https://download.pytorch.org/whl/cu126 "torch==2.13.0"')
    assert "--find-links" not in line  # a local torch-2.13.0+cpu wheel would satisfy "torch==2.13.0" too
    line = _torch_install(_dry_run(repo_root, venv, "CUDA=cu128", "TORCH=torch==2.9.1"))
    assert line.endswith('--index-url https://download.pytorch.org/whl/cu128 "torch==2.9.1"')


def test_default_and_overridden_cpu_requests(repo_root, venv):
    default = _torch_install(_dry_run(repo_root, venv))
    assert default.endswith('"torch==2.13.0"') and ("--find-links" in default or "/whl/cpu" in default)
    other = _torch_install(_dry_run(repo_root, venv, "TORCH=torch==2.7.1"))  # a version the local folder lacks
    assert other.endswith('--index-url https://download.pytorch.org/whl/cpu "torch==2.7.1"')
    custom = _torch_install(_dry_run(repo_root, venv, "TORCH_INDEX=--index-url https://example.invalid/simple"))
    assert custom.endswith('pip install --quiet --index-url https://example.invalid/simple "torch==2.13.0"')
    pypi = _torch_install(_dry_run(repo_root, venv, "TORCH_INDEX="))  # pip's own default index
    assert pypi.endswith('pip install --quiet "torch==2.13.0"')


def test_the_stamp_follows_the_torch_request(repo_root, venv):
    """Same request: nothing to do. Another TORCH or CUDA: torch is checked, reinstalled and the stamp rewritten;
    the project install keeps torch at the installed build (a constraint)."""
    lines = _dry_run(repo_root, venv, "CUDA=cu126")
    (stamp_line,) = [x for x in lines if ".torch-request" in x and x.startswith("printf")]
    request = stamp_line.split("'")[3]
    assert request == "torch==2.13.0 cu126 --index-url https://download.pytorch.org/whl/cu126"
    assert any("-c " in x and "-e \".[dev,distributed]\"" in x for x in lines)
    (venv / ".torch-request").write_text(request + "\n")  # as the recipe writes it
    (venv / ".installed").touch()
    assert not [x for x in _dry_run(repo_root, venv, "CUDA=cu126") if "pip" in x]  # up to date
    for change in (["CUDA=cu128"], ["CUDA=cu126", "TORCH=torch==2.9.1"], []):
        lines = _dry_run(repo_root, venv, *change)
        assert any("torch_request.py" in x and "pip uninstall --quiet --yes torch" in x for x in lines), change
        assert _torch_install(lines) and any(x.startswith("printf") for x in lines), change


@pytest.mark.parametrize("request_, build, version, cuda, ok", [
    ("torch==2.13.0", "cpu", "2.13.0+cpu", None, True),
    ("torch==2.13.0", "cu126", "2.13.0+cpu", None, False),  # same version, wrong build: reinstall
    ("torch==2.13.0", "cu126", "2.13.0+cu126", "12.6", True),
    ("torch==2.13.0", "cu128", "2.13.0+cu126", "12.6", False),
    ("torch==2.9.1", "cpu", "2.13.0+cpu", None, False),
    ("torch>=2.6", "cpu", "2.13.0+cpu", None, True),
    ("torch==2.13.0", "any", "2.13.0+cu126", "12.6", True),
])
def test_installed_torch_meets_the_request(request_, build, version, cuda, ok):
    assert satisfies(request_, build, version, cuda) is ok


def test_torch_floor():
    assert below_floor("2.5.1+cu124", "2.6") and not below_floor("2.6.0", "2.6")
    assert not below_floor("2.13.0+cpu", "2.6") and not below_floor("2.7.0.dev20250101+cu126", "2.6")
