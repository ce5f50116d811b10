"""`ruff format --check .` and `ruff check .` pass, so CI (scripts/test) enforces them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_tool(name: str, *args: str) -> subprocess.CompletedProcess:
    """Run a console script from the venv that runs the tests, from the repo root."""
    tool = Path(sys.executable).parent / name
    assert tool.exists(), f"{tool} is missing: scripts/setup installs the dev extras"
    return subprocess.run(
        [str(tool), *args],
        cwd=REPO,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("command", [("format", "--check"), ("check",)], ids=" ".join)
def test_ruff_passes(command):
    result = run_tool("ruff", *command, "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr
