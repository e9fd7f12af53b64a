"""`make install`'s torch step: does the torch in this virtualenv satisfy the request, and is it new enough?

    python codeparrot/tools/torch_request.py REQUEST BUILD [--floor 2.6]

REQUEST is a pip requirement (`torch==2.13.0`, `torch>=2.6`), BUILD the build it must be: `cpu`, a CUDA tag of
PyTorch's wheel index (`cu126`, `cu128`, ...), or `any` (a custom TORCH_INDEX: the build cannot be told from it).
Exit status 0: nothing to uninstall (no torch yet, or one that satisfies both); 1: an installed torch that does
not (the Makefile then uninstalls it, so that pip does not keep a CPU 2.13.0 for a CUDA 2.13.0 request: the version
alone would satisfy pip). With `--floor`, the check is instead that the installed torch is at least that version
(exit 2 and one line on stderr when not).

Run by path before the project is installed: standard library and `packaging` (pip's vendored copy when the
virtualenv has no other yet; importing pip in a process that later compiles with inductor breaks setuptools'
distutils shim, so the real package is preferred).
"""

from __future__ import annotations

import argparse
import sys


def build_tag(cuda_version: str | None) -> str:
    """torch.version.cuda ("12.6", None) as the wheel index names it ("cu126", "cpu")."""
    return "cpu" if not cuda_version else "cu" + cuda_version.replace(".", "")


def _packaging():
    try:
        import packaging.requirements
        import packaging.version

        return packaging
    except ImportError:  # a fresh virtualenv holding only torch: pip's copy
        from pip._vendor import packaging
        from pip._vendor.packaging import requirements, version  # noqa: F401 - loads the submodules

        return packaging


def satisfies(request: str, build: str, version: str, cuda_version: str | None) -> bool:
    """Whether a torch `version` built for `cuda_version` meets `request` (a pip requirement) and `build`."""
    Requirement = _packaging().requirements.Requirement

    if build != "any" and build_tag(cuda_version) != build:
        return False
    return Requirement(request).specifier.contains(version, prereleases=True)


def below_floor(version: str, floor: str) -> bool:
    Version = _packaging().version.Version

    return Version(Version(version).base_version) < Version(floor)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("request")
    parser.add_argument("build")
    parser.add_argument("--floor", help="exit 2 when the installed torch is older than this version")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        if args.floor:
            print(f"error: no importable torch after installing {args.request}", file=sys.stderr)
            return 2
        return 0
    if args.floor:
        if below_floor(torch.__version__, args.floor):
            print(f"error: torch {torch.__version__} ({args.request}) is older than {args.floor}, the oldest that "
                  f"transformers 5 and FSDP2 accept (pyproject.toml); ask for a newer TORCH", file=sys.stderr)
            return 2
        return 0
    return 0 if satisfies(args.request, args.build, torch.__version__, torch.version.cuda) else 1


if __name__ == "__main__":
    sys.exit(main())
