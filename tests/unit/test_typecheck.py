"""mypy passes over the files [tool.mypy] in pyproject.toml names (shared/ and fleet's CLIs).

A cold run takes ~40 s (it reads mlx's and mlx_lm's own type information); later runs reuse
.mypy_cache and take ~1-2 s.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_tool(name: str, *args: str) -> subprocess.CompletedProcess:
    """Run a console script from the venv that runs the tests, from the repo root."""
    tool = Path(sys.executable).parent / name
    assert tool.exists(), f"{tool} is missing: scripts/setup installs the dev extras"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [str(tool), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )


def test_mypy_passes():
    result = run_tool("mypy")
    assert result.returncode == 0, result.stdout + result.stderr
