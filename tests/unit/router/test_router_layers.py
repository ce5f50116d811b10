"""The router's import contracts hold with type-checking imports counted.

pyproject.toml excludes imports made only for type checking (the worker still has such cycles,
being mended); the router has none: a reply flows up through callbacks and protocols its lower
layers declare (router/cluster's WorkerReplies, router/text's ReplyJob, router/metrics'
ScrapedWorker), never by naming a module above. This runs the router's contracts with
`exclude_type_checking_imports = false`, so a type-only import up the layers fails here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from shared.config import fleet as fleet_config

REPO = Path(__file__).resolve().parents[3]


def _importlinter() -> dict:
    """[tool.importlinter] of pyproject.toml."""
    pyproject = fleet_config._toml().loads((REPO / "pyproject.toml").read_text())
    return pyproject["tool"]["importlinter"]


def _router_contracts(config: dict) -> list[dict]:
    """The contracts that speak of the router; the sibling-cycle one over router's packages."""
    kept = []
    for contract in config["contracts"]:
        if contract["type"] == "acyclic_siblings":
            ancestors = [a for a in contract["ancestors"] if a.split(".")[0] == "router"]
            kept.append(contract | {"ancestors": ancestors})
        elif "router" in json.dumps(contract):
            kept.append(contract)
    return kept


def _toml(settings: dict, contracts: list[dict]) -> str:
    """A pyproject holding only [tool.importlinter] (JSON's strings and lists are TOML's)."""
    lines = ["[tool.importlinter]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in settings.items()]
    for contract in contracts:
        lines += ["", "[[tool.importlinter.contracts]]"]
        lines += [f"{key} = {json.dumps(value)}" for key, value in contract.items()]
    return "\n".join(lines) + "\n"


def test_router_contracts_hold_with_type_checking_imports(tmp_path):
    config = _importlinter()
    contracts = _router_contracts(config)
    names = [c["name"] for c in contracts]
    assert any(c["type"] == "layers" for c in contracts), names  # the layers are checked
    settings = {
        "root_packages": config["root_packages"],
        "include_external_packages": True,
        "exclude_type_checking_imports": False,
    }
    path = tmp_path / "pyproject.toml"
    path.write_text(_toml(settings, contracts))
    tool = Path(sys.executable).parent / "lint-imports"
    assert tool.exists(), f"{tool} is missing: scripts/setup installs the dev extras"
    result = subprocess.run(
        [str(tool), "--no-cache", "--no-logo", str(path)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
