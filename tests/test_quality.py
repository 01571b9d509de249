"""The code stays clean: ruff (lint and format) and mypy (strict) on every run.

The sources live in top-level folders (``lakeshore/``, ``worker/``, ``cli/``,
``handlers/``, ``infra/``) that install as one package, ``dreamlake.lakeshore``. mypy
needs that package on disk, so the test lays it out as a tree of links in ``.typecheck/``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: folder → where it sits inside the installed package
LAYOUT = {
    "lakeshore": "",
    "worker": "worker",
    "cli": "cli",
    "handlers": "handlers",
    "infra": "infra",
}

pytestmark = pytest.mark.timeout(600)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, check=False
    )


def _link_tree() -> None:
    pkg = ROOT / ".typecheck" / "dreamlake" / "lakeshore"
    shutil.rmtree(ROOT / ".typecheck", ignore_errors=True)
    pkg.mkdir(parents=True)
    for folder, inside in LAYOUT.items():
        src = ROOT / folder
        dest = pkg / inside if inside else pkg
        if inside:
            os.symlink(src, dest, target_is_directory=True)
            continue
        for entry in src.iterdir():
            if entry.name != "__pycache__":
                os.symlink(entry, dest / entry.name, target_is_directory=entry.is_dir())


def test_ruff_lint() -> None:
    proc = _run("ruff", "check", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_format() -> None:
    proc = _run("ruff", "format", "--check", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_strict() -> None:
    _link_tree()
    proc = _run("mypy")
    assert proc.returncode == 0, proc.stdout + proc.stderr
