"""The host agent against a router socket: it says hello with what it can serve, reports on
time, refuses what it cannot start (unknown model, unreadable files, over budget) without
starting anything, and stops as told (SIGTERM: 0; a router's refusal: non-zero)."""

from __future__ import annotations

import os
import signal

import pytest

from fleet.host.catalog import Catalog
from fleet.host.memory import default_budget, physical_bytes, rss_bytes
from shared.config.sections import ModelSection
from shared.placement.messages import (
    HostAck,
    HostHello,
    HostReport,
    StartWorker,
    StopWorker,
    WorkerExited,
)
from shared.protocol import ReRegister
from tests.unit.fleet.host.conftest import write_config

GIB = 1 << 30


def test_hello_lists_the_readable_models_and_the_budget(fake_router, start_agent, tmp_path):
    config = write_config(tmp_path / "fleet.toml", {"smol": None, "gone": "/nonexistent/m"})
    start_agent(config, fake_router.endpoint, "--memory-budget", "3GiB")
    hello = fake_router.accept(report_interval_s=0.1)
    assert (hello.host_id, hello.budget_bytes, hello.models) == ("host-t", 3 * GIB, ("smol",))
    assert hello.workers == () and hello.total_bytes == physical_bytes() > 0
    reports = [fake_router.expect(HostReport) for _ in range(3)]
    assert all(r.host_id == "host-t" and r.workers == () for r in reports)


def test_refused_at_once_unknown_unreadable_over_budget(fake_router, start_agent, tmp_path):
    config = write_config(tmp_path / "fleet.toml", {"smol": None, "gone": "/nonexistent/m"})
    start_agent(config, fake_router.endpoint, "--memory-budget", "1GiB")
    fake_router.accept()
    cases = {
        StartWorker("w-1", "other", GIB // 2, 1 << 26): "'other' is not in this host's catalog",
        StartWorker("w-2", "gone", GIB // 2, 1 << 26): "cannot read /nonexistent/m",
        StartWorker("w-3", "smol", 2 * GIB, 1 << 26): "needs 2.00 GiB, host host-t has 1.00 GiB "
        "of 1.00 GiB free",
    }
    for start, reason in cases.items():
        fake_router.send(start)
        exited = fake_router.expect(WorkerExited)
        assert (exited.worker_id, exited.model, exited.asked) == (
            start.worker_id,
            start.model,
            False,
        )
        assert reason in exited.reason
    report = fake_router.expect(HostReport)
    assert report.workers == ()  # nothing was started
    fake_router.send(StopWorker("w-9"))  # not running here: said so
    exited = fake_router.expect(WorkerExited)
    assert exited.worker_id == "w-9" and exited.asked and "not running" in exited.reason


def test_reregister_gets_hello_again(fake_router, start_agent, tmp_path):
    config = write_config(tmp_path / "fleet.toml", {"smol": None})
    start_agent(config, fake_router.endpoint)
    fake_router.accept()
    fake_router.send(ReRegister("router restarted"))
    hello = fake_router.expect(HostHello)
    assert hello.host_id == "host-t" and hello.budget_bytes == default_budget()


def test_sigterm_exits_0_and_a_refusal_exits_1(fake_router, start_agent, tmp_path):
    config = write_config(tmp_path / "fleet.toml", {"smol": None})
    agent = start_agent(config, fake_router.endpoint)
    fake_router.accept()
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(timeout=10) == 0
    refused = start_agent(config, fake_router.endpoint)
    fake_router.expect(HostHello)
    fake_router.send(HostAck(False, reason="host id host-t is taken"))
    assert refused.wait(timeout=10) == 1
    assert "host id host-t is taken" in refused.stderr.read()


def test_memory_and_catalog_helpers(tmp_path):
    assert rss_bytes(os.getpid()) > 0 and rss_bytes(2**22 + 7) == 0
    assert 0 < default_budget() < physical_bytes()
    locked = tmp_path / "locked"
    locked.mkdir()
    catalog = Catalog((ModelSection(id="a", path=str(locked)), ModelSection(path="org/repo")))
    assert catalog.servable() == ("a", "repo")  # a repo id is the worker's to fetch
    if os.geteuid() != 0:  # root reads everything
        locked.chmod(0)
        assert "cannot read" in catalog.problem("a") and catalog.servable() == ("repo",)
    assert catalog.find("repo").path == "org/repo" and catalog.problem("b").startswith("model 'b'")


def test_an_agent_refuses_worker_settings_it_cannot_apply(tmp_path, capsys):
    from fleet.host.cli import main

    config = tmp_path / "fleet.toml"
    config.write_text('[[models]]\nid = "m"\npath = "/nowhere"\n[worker]\nkv_fraction = 0.5\n')
    with pytest.raises(SystemExit):
        main(["--config", str(config)])
    assert "kv_fraction and tp_hosts do not apply" in capsys.readouterr().err
