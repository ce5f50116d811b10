"""The import contracts in pyproject.toml ([tool.importlinter]) hold.

They say which package may import which: router and worker only meet over the wire,
shared imports no process package, router.api does no I/O, worker.kv knows neither the
scheduler nor the model, and no subpackage has an import cycle between its modules.
Imports made only for type checking count (`exclude_type_checking_imports = false`).
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
        [str(tool), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )


def test_import_contracts_are_kept():
    result = run_tool("lint-imports", "--no-cache", "--no-logo")
    assert result.returncode == 0, result.stdout + result.stderr


def test_type_checking_imports_count():
    """A type-only import is a dependency too: the contracts must not exclude them."""
    text = (REPO / "pyproject.toml").read_text()
    assert "exclude_type_checking_imports = false" in text
