"""Fetching a catalog model's `source` from a Hub (shared/models/hub.py), against the local
stand-in of the Hub's file API (tests/support/hub_server.py): whole files checked against the
Hub's hashes, a partial file resumed, a wrong byte refused, offline mode honoured."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from shared.models.hub import Downloader, DownloadError, HubSource, Progress
from tests.support.hub_server import HubServer, serving

REPO = "org/tiny"
WEIGHTS = os.urandom(300_000)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "published"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (d / "tokenizer.json").write_text(json.dumps({"version": "1.0"}))
    (d / "model.safetensors").write_bytes(WEIGHTS)
    (d / "README.md").write_text("not wanted")
    return d


@pytest.fixture
def hub(model_dir: Path):
    with serving(HubServer({REPO: model_dir})) as server:
        yield server


def downloader(hub: HubServer, tmp_path: Path, **kw) -> Downloader:
    return Downloader(endpoint=hub.url, cache_dir=tmp_path / "cache", offline=False, **kw)


def test_a_fetch_brings_the_wanted_files_checked_and_counts_them(hub, tmp_path, model_dir):
    progress = Progress()
    snapshot = downloader(hub, tmp_path).pull(HubSource(REPO), progress)
    names = sorted(p.name for p in snapshot.iterdir())
    assert names == ["config.json", "model.safetensors", "tokenizer.json"]  # no README
    assert (snapshot / "model.safetensors").read_bytes() == WEIGHTS
    assert progress.done_bytes == progress.total_bytes == progress.fetched_bytes
    assert progress.percent == 100
    assert hub.served["org/tiny/model.safetensors"] == len(WEIGHTS)


def test_a_checked_snapshot_is_found_again_without_the_hub(hub, tmp_path):
    first = downloader(hub, tmp_path).pull(HubSource(REPO))
    offline = Downloader(endpoint=hub.url, cache_dir=tmp_path / "cache", offline=True)
    assert offline.local(HubSource(REPO)) == first
    assert offline.pull(HubSource(REPO)) == first
    hub.served.clear()
    assert downloader(hub, tmp_path).pull(HubSource(REPO)) == first
    assert sum(hub.served.values()) == 0  # nothing fetched twice


def test_offline_without_the_files_says_so(hub, tmp_path):
    offline = Downloader(endpoint=hub.url, cache_dir=tmp_path / "cache", offline=True)
    with pytest.raises(DownloadError, match="HF_HUB_OFFLINE"):
        offline.pull(HubSource(REPO))


def test_a_partial_file_is_resumed_not_fetched_again(hub, tmp_path):
    dl = downloader(hub, tmp_path)
    plan = dl.plan(HubSource(REPO))
    weights = next(f for f in plan.files if f.name == "model.safetensors")
    plan.partial(weights).parent.mkdir(parents=True)
    plan.partial(weights).write_bytes(WEIGHTS[:200_000])  # a download killed there
    progress = Progress()
    snapshot = dl.fetch(plan, progress)
    assert hub.served["org/tiny/model.safetensors"] == len(WEIGHTS) - 200_000
    assert (snapshot / "model.safetensors").read_bytes() == WEIGHTS
    assert progress.done_bytes == progress.total_bytes
    assert progress.fetched_bytes == progress.total_bytes - 200_000


def test_a_wrong_byte_is_refused_naming_the_file_and_discarded(hub, tmp_path):
    hub.corrupt = {"org/tiny/model.safetensors"}
    dl = downloader(hub, tmp_path)
    with pytest.raises(DownloadError) as failed:
        dl.pull(HubSource(REPO))
    assert "model.safetensors" in str(failed.value) and "sha256" in str(failed.value)
    assert dl.local(HubSource(REPO)) is None
    assert not list((tmp_path / "cache").rglob("*.incomplete"))
    hub.corrupt = set()
    snapshot = dl.pull(HubSource(REPO))  # fetched again whole, and right
    assert (snapshot / "model.safetensors").read_bytes() == WEIGHTS


def test_a_small_file_is_checked_by_its_git_hash(hub, tmp_path):
    hub.corrupt = {"org/tiny/config.json"}
    with pytest.raises(DownloadError, match="config.json.*git sha1"):
        downloader(hub, tmp_path).pull(HubSource(REPO))


def test_a_bad_blob_already_in_the_cache_is_refused(hub, tmp_path):
    dl = downloader(hub, tmp_path)
    plan = dl.plan(HubSource(REPO))
    weights = next(f for f in plan.files if f.name == "model.safetensors")
    plan.blob(weights).parent.mkdir(parents=True)
    plan.blob(weights).write_bytes(b"\0" * weights.size)
    with pytest.raises(DownloadError, match="model.safetensors"):
        dl.fetch(plan)
    assert not plan.blob(weights).exists()


def test_without_weights_fetches_config_and_tokenizer_only(hub, tmp_path):
    dl = downloader(hub, tmp_path)
    snapshot = dl.pull(HubSource(REPO).without_weights())
    assert sorted(p.name for p in snapshot.iterdir()) == ["config.json", "tokenizer.json"]
    assert hub.served["org/tiny/model.safetensors"] == 0
    assert dl.local(HubSource(REPO)) is None  # the whole set was never fetched
    assert dl.plan(HubSource(REPO)).weight_bytes == len(WEIGHTS)


def test_what_cannot_be_fetched_is_named(hub, tmp_path):
    dl = downloader(hub, tmp_path)
    with pytest.raises(DownloadError, match="no such repo"):
        dl.pull(HubSource("org/missing"))
    with pytest.raises(DownloadError, match="no revision 'v9'"):
        dl.pull(HubSource(REPO, revision="v9"))
    with pytest.raises(DownloadError, match="allow_patterns"):
        dl.pull(HubSource(REPO, allow_patterns=("*.gguf",)))
    unreachable = Downloader(endpoint="http://127.0.0.1:9", cache_dir=tmp_path / "c", offline=False)
    with pytest.raises(DownloadError, match="cannot fetch org/tiny@main from http://127.0.0.1:9"):
        unreachable.pull(HubSource(REPO))


def test_a_pinned_commit_needs_no_ref(hub, tmp_path):
    dl = downloader(hub, tmp_path)
    commit = dl.plan(HubSource(REPO)).commit
    snapshot = dl.pull(HubSource(REPO, revision=commit))
    assert snapshot.name == commit
    assert dl.local(HubSource(REPO, revision=commit)) == snapshot


def test_hf_token_is_sent_to_a_private_repo(hub, tmp_path, monkeypatch):
    hub.token = "hf_secret"
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with pytest.raises(DownloadError, match="set HF_TOKEN"):
        downloader(hub, tmp_path).pull(HubSource(REPO))
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    snapshot = downloader(hub, tmp_path).pull(HubSource(REPO))
    assert (snapshot / "model.safetensors").read_bytes() == WEIGHTS


def test_two_fetches_sharing_a_cache_take_turns(hub, tmp_path):
    hub.throttle = 400_000  # a few chunks a second: the second fetch waits on the lock
    results = []

    def fetch() -> None:
        results.append(downloader(hub, tmp_path).pull(HubSource(REPO)))

    threads = [threading.Thread(target=fetch) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(results) == 2 and results[0] == results[1]
    assert (results[0] / "model.safetensors").read_bytes() == WEIGHTS
    assert hub.served["org/tiny/model.safetensors"] == len(WEIGHTS)  # fetched once


def test_a_catalog_entry_resolves_to_its_fetched_snapshot(hub, tmp_path, monkeypatch):
    from huggingface_hub import constants

    from shared.config.sections import ModelSection
    from shared.models.store import resolve_metadata, resolve_section

    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    entry = ModelSection(source=REPO)
    light, weight_bytes = resolve_metadata(entry)  # a router's: config and tokenizer
    assert weight_bytes == len(WEIGHTS) and not (light / "model.safetensors").exists()
    said: list[str] = []
    snapshot = resolve_section(entry, said.append)  # a worker's: everything
    assert (snapshot / "model.safetensors").read_bytes() == WEIGHTS
    assert len(said) == 1 and "fetching org/tiny@main" in said[0]
    assert resolve_section(entry, said.append) == snapshot and len(said) == 1  # cached
    assert resolve_metadata(entry) == (snapshot, None)  # the weights are here: measured
