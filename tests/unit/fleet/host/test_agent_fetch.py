"""A host agent fetching Hub models (issue 51) from the local stand-in of the Hub
(tests/support/hub_server.py): FetchModel fetches with its bytes in the reports, then the model
is `held` (in a later agent's hello too); a start of a model whose file is corrupt waits for the
fetch, counted against the budget, and fails naming the file; a start stopped while it waits
is said to be stopped."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shared.placement.messages import (
    FetchEnded,
    FetchModel,
    HostHello,
    HostReport,
    StartWorker,
    StopWorker,
    WorkerExited,
)
from tests.support.hub_server import HubServer, serving

GIB = 1 << 30
WEIGHTS = os.urandom(120_000)


@pytest.fixture
def hub(tmp_path: Path):
    published = tmp_path / "published"
    published.mkdir()
    (published / "config.json").write_text('{"model_type": "llama"}')
    (published / "model.safetensors").write_bytes(WEIGHTS)
    server = HubServer({"org/tiny": published, "org/bad": published}, throttle=60_000)
    server.corrupt = {"org/bad/model.safetensors"}
    with serving(server):
        yield server


def hub_config(path: Path) -> Path:
    path.write_text(
        '[[models]]\nid = "tiny"\nsource = "org/tiny"\n[[models]]\nid = "bad"\nsource = "org/bad"\n'
    )
    return path


def env_of(hub: HubServer, tmp_path: Path) -> dict:
    return {"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(tmp_path / "hf"), "HF_HUB_OFFLINE": ""}


def test_fetch_model_reports_its_bytes_then_holds_it(hub, fake_router, start_agent, tmp_path):
    config = hub_config(tmp_path / "fleet.toml")
    start_agent(config, fake_router.endpoint, env=env_of(hub, tmp_path))
    hello = fake_router.accept(report_interval_s=0.1)
    assert hello.models == ("tiny", "bad") and hello.held == ()
    fake_router.send(FetchModel("tiny"))
    under_way = fake_router.expect(
        HostReport, where=lambda r: any(0 < f.done_bytes < f.total_bytes for f in r.fetches)
    )
    assert under_way.fetches[0].model == "tiny"
    ended = fake_router.expect(FetchEnded)
    assert (ended.model, ended.ok) == ("tiny", True)
    report = fake_router.expect(HostReport)
    assert report.held == ("tiny",) and report.fetches == ()
    fake_router.send(FetchModel("tiny"))  # held: said at once
    assert fake_router.expect(FetchEnded).ok
    fake_router.send(FetchModel("other"))
    refused = fake_router.expect(FetchEnded)
    assert not refused.ok and "not in this host's catalog" in refused.reason


def test_a_start_waits_for_its_fetch_and_fails_with_a_bad_file(
    hub, fake_router, start_agent, tmp_path
):
    config = hub_config(tmp_path / "fleet.toml")
    env = env_of(hub, tmp_path)
    start_agent(config, fake_router.endpoint, "--memory-budget", "2GiB", env=env)
    fake_router.accept(report_interval_s=0.1)
    fake_router.send(StartWorker("w-1", "bad", GIB, 1 << 26))
    fake_router.send(StartWorker("w-2", "tiny", 3 * GIB // 2, 1 << 26))  # w-1's room is taken
    over = fake_router.expect(WorkerExited, where=lambda m: m.worker_id == "w-2")
    assert "has 1.00 GiB of 2.00 GiB free" in over.reason
    failed = fake_router.expect(WorkerExited, timeout=20, where=lambda m: m.worker_id == "w-1")
    assert not failed.asked and "model.safetensors of org/bad@main failed its checksum" in (
        failed.reason
    )
    ended = next(m for m in fake_router.seen if isinstance(m, FetchEnded))
    assert not ended.ok and "model.safetensors" in ended.reason
    fake_router.send(StartWorker("w-3", "tiny", GIB, 1 << 26))
    waiting = fake_router.expect(HostReport, where=lambda r: r.fetches)
    assert [(w.worker_id, w.pid, w.estimate_bytes) for w in waiting.workers] == [("w-3", 0, GIB)]
    fake_router.send(StopWorker("w-3", "unloaded"))
    stopped = fake_router.expect(WorkerExited, where=lambda m: m.worker_id == "w-3")
    assert stopped.asked and stopped.model == "tiny"
    assert fake_router.expect(FetchEnded).ok  # the fetch went on: the files are kept


def test_a_later_agent_says_it_holds_what_was_fetched(hub, fake_router, start_agent, tmp_path):
    config = hub_config(tmp_path / "fleet.toml")
    env = env_of(hub, tmp_path)
    first = start_agent(config, fake_router.endpoint, env=env)
    fake_router.accept()
    fake_router.send(FetchModel("tiny"))
    assert fake_router.expect(FetchEnded).ok
    first.kill()
    first.wait()
    start_agent(config, fake_router.endpoint, env={**env, "HF_HUB_OFFLINE": "1"})
    hello = fake_router.expect(HostHello)
    assert hello.held == ("tiny",) and hello.models == ("tiny",)  # offline: bad is not here
