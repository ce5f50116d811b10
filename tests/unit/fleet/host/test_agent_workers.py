"""The host agent with real workers of the default model: a started worker registers with the
router and shows in HostReport with its resident memory; its estimate counts against the
budget; StopWorker ends it (asked); a worker whose weights are corrupt ends with its own error
text in the reason; and the agent's workers die with it, even by SIGKILL."""

from __future__ import annotations

import os
import shutil
import signal
import time

import pytest

from shared.placement.messages import HostReport, StartWorker, StopWorker, WorkerExited
from shared.protocol import Register
from tests.unit.fleet.host.conftest import write_config

pytestmark = pytest.mark.slow
GIB = 1 << 30
KV = 64 << 20


def running_worker(router, worker_id: str) -> int:
    """Wait for the worker's Register, then its pid from a HostReport."""
    register = router.expect(Register, timeout=120, where=lambda r: r.worker_id == worker_id)
    report = router.expect(
        HostReport, where=lambda r: any(w.worker_id == worker_id for w in r.workers)
    )
    [worker] = [w for w in report.workers if w.worker_id == worker_id]
    assert worker.rss_bytes > 0 and worker.pid == register.pid and worker.model == "smol"
    return worker.pid


def gone(pid: int) -> bool:
    """Ended (or a zombie nobody reaped yet)."""
    if not os.path.isdir("/proc"):  # macOS: the orphan is reaped by launchd
        try:
            os.kill(pid, 0)
            return False
        except ProcessLookupError:
            return True
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.split()[1] == "Z" for line in f if line.startswith("State:"))
    except FileNotFoundError:
        return True


@pytest.fixture
def corrupt_model_dir(default_model_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(default_model_dir, broken)
    (broken / "model.safetensors").write_bytes(b"these are not weights\n" * 100)
    return broken


def test_start_report_budget_stop_and_a_corrupt_model(
    fake_router, start_agent, tmp_path, corrupt_model_dir
):
    models = {"smol": None, "broken": str(corrupt_model_dir)}
    config = write_config(tmp_path / "fleet.toml", models)
    start_agent(config, fake_router.endpoint, "--memory-budget", "2GiB", "--stop-grace", "5")
    fake_router.accept(report_interval_s=0.2)
    fake_router.send(StartWorker("w-1", "smol", GIB + GIB // 2, KV))
    running_worker(fake_router, "w-1")
    fake_router.send(StartWorker("w-2", "smol", GIB, KV))  # 1.5 of 2 GiB are taken
    refused = fake_router.expect(WorkerExited, where=lambda m: m.worker_id == "w-2")
    assert not refused.asked and "has 0.50 GiB of 2.00 GiB free" in refused.reason
    fake_router.send(StopWorker("w-1", reason="idle"))
    stopped = fake_router.expect(WorkerExited, timeout=20, where=lambda m: m.worker_id == "w-1")
    assert stopped.asked and stopped.model == "smol"

    fake_router.send(StartWorker("w-3", "broken", GIB, KV))
    failed = fake_router.expect(WorkerExited, timeout=120, where=lambda m: m.worker_id == "w-3")
    assert not failed.asked and failed.reason.startswith("exit code 1: ")
    # the worker's own error text: MLX's, naming the file it could not load
    assert "Error" in failed.reason and "model.safetensors" in failed.reason, failed.reason
    assert (tmp_path / "logs" / "w-3.log").read_text().strip()


def test_workers_die_with_the_agent_even_by_sigkill(fake_router, start_agent, tmp_path):
    config = write_config(tmp_path / "fleet.toml", {"smol": None})
    agent = start_agent(config, fake_router.endpoint)
    fake_router.accept(report_interval_s=0.2)
    fake_router.send(StartWorker("w-1", "smol", GIB, KV))
    pid = running_worker(fake_router, "w-1")
    os.kill(agent.pid, signal.SIGKILL)
    agent.wait()
    deadline = time.monotonic() + 20
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gone(pid)
