"""`mlx-fleet-model pull`: a Hub model fetched into this machine's cache, checked, its path
printed; a corrupt file or a bad repo id is an error naming it (exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.hub_server import HubServer, serving
from tests.support.paths import ROOT

WEIGHTS = os.urandom(50_000)


@pytest.fixture
def hub(tmp_path: Path):
    published = tmp_path / "published"
    published.mkdir()
    (published / "config.json").write_text('{"model_type": "llama"}')
    (published / "model.safetensors").write_bytes(WEIGHTS)
    server = HubServer({"org/tiny": published, "org/bad": published})
    server.corrupt = {"org/bad/model.safetensors"}
    with serving(server):
        yield server


def pull(hub: HubServer, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(tmp_path / "hf")}
    env.pop("HF_HUB_OFFLINE", None)
    cmd = [sys.executable, "-m", "fleet.model_cli", "pull", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_pull_fetches_checks_and_prints_the_path(hub, tmp_path):
    done = pull(hub, tmp_path, "org/tiny", "--allow-pattern", "*.safetensors")
    assert done.returncode == 0, done.stderr
    snapshot = Path(done.stdout.strip())
    assert [p.name for p in snapshot.iterdir()] == ["model.safetensors"]
    assert (snapshot / "model.safetensors").read_bytes() == WEIGHTS
    assert "all files checked" in done.stderr


def test_pull_names_a_corrupt_file_and_a_bad_repo_id(hub, tmp_path):
    bad = pull(hub, tmp_path, "org/bad")
    assert bad.returncode == 2
    assert "model.safetensors of org/bad@main failed its checksum" in bad.stderr
    wrong = pull(hub, tmp_path, "not-a-repo")
    assert wrong.returncode == 2 and "'not-a-repo' is not a Hub repo id" in wrong.stderr
