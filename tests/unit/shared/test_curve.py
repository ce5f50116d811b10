"""ZeroMQ CURVE between router and workers: key files, who may connect, when CURVE is required."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import stat
from pathlib import Path

import pytest
import zmq.auth

from fleet import curve_keys_cli
from router.cli import check_security
from router.cluster.worker_socket import WorkerSocket
from router.config import ModelSpec, RouterConfig
from shared.curve import (
    CurveError,
    configure_server,
    fingerprint,
    generate_keypair,
    is_loopback_endpoint,
    load_public,
    require_curve,
)
from tests.support.fake_worker import FakeWorker, FakeWorkerConfig

COMPLETION = {"model": "tiny", "prompt": "hello there", "max_tokens": 3}


@pytest.fixture
def fleet_keys(tmp_path):
    """router + worker-a (authorized) + stranger (not), as mlx-fleet-keys would write them."""
    keys = tmp_path / "keys"
    for name in ("router", "worker-a", "stranger"):
        assert curve_keys_cli.main(["generate", "--out", str(keys), "--name", name]) == 0
    authorized = tmp_path / "authorized_workers"
    authorized.mkdir()
    (authorized / "worker-a.key").write_bytes((keys / "worker-a.key").read_bytes())
    return keys, authorized


def test_generated_files_have_safe_modes_and_pyzmq_format(tmp_path):
    public_file, secret_file = generate_keypair(tmp_path, "w1")
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(public_file.stat().st_mode) == 0o644
    public, secret = zmq.auth.load_certificate(secret_file)
    assert zmq.auth.load_certificate(public_file) == (public, None)
    assert len(public) == len(secret) == 40  # Z85 of 32 bytes
    assert secret.decode() not in public_file.read_text()
    assert fingerprint(public) in public_file.read_text()


def test_generate_refuses_to_overwrite(tmp_path, capsys):
    generate_keypair(tmp_path, "w1")
    assert curve_keys_cli.main(["generate", "--out", str(tmp_path), "--name", "w1"]) == 1
    assert "--force" in capsys.readouterr().err
    before = load_public(tmp_path / "w1.key")
    assert curve_keys_cli.main(["generate", "--out", str(tmp_path), "--name", "w1", "--force"]) == 0
    assert load_public(tmp_path / "w1.key") != before


def test_api_key_command_appends_to_a_private_file(tmp_path, capsys):
    keys_file = tmp_path / "api_keys"
    assert curve_keys_cli.main(["api-key", "--file", str(keys_file), "--label", "laptop"]) == 0
    assert curve_keys_cli.main(["api-key", "--file", str(keys_file)]) == 0
    printed = capsys.readouterr().out.split()
    assert keys_file.read_text().splitlines() == ["# laptop", printed[0], printed[1]]
    assert stat.S_IMODE(keys_file.stat().st_mode) == 0o600


@pytest.mark.parametrize(
    ("endpoint", "loopback"),
    [
        ("tcp://127.0.0.1:5555", True),
        ("tcp://127.0.0.1:*", True),
        ("tcp://localhost:5555", True),
        ("tcp://[::1]:5555", True),
        ("ipc:///tmp/fleet.sock", True),
        ("tcp://0.0.0.0:5555", False),
        ("tcp://*:5555", False),
        ("tcp://10.0.0.5:5555", False),
        ("tcp://en0:5555", False),
        ("tcp://studio.local:5555", False),
    ],
)
def test_loopback_endpoints(endpoint, loopback):
    assert is_loopback_endpoint(endpoint) is loopback


def test_plain_tcp_beyond_loopback_is_refused():
    with pytest.raises(CurveError, match="without CURVE"):
        require_curve("tcp://0.0.0.0:5555", curve_enabled=False)
    require_curve("tcp://0.0.0.0:5555", curve_enabled=True)
    with pytest.raises(CurveError, match="without CURVE"):
        WorkerSocket("tcp://0.0.0.0:*", on_unreachable=print)
    config = RouterConfig(models=(ModelSpec(Path(".")),), zmq_bind="tcp://0.0.0.0:5555")
    with pytest.raises(SystemExit, match="mlx-fleet-keys generate"):
        check_security(config)


async def test_server_setup_errors_are_clear(tmp_path, fleet_keys):
    keys, _ = fleet_keys
    sock = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
    try:
        with pytest.raises(CurveError, match="does not exist"):
            configure_server(sock, keys / "router.key_secret", tmp_path / "missing")
        with pytest.raises(CurveError, match="no secret key"):
            configure_server(sock, keys / "router.key", tmp_path)
    finally:
        sock.close(linger=0)


@pytest.fixture
async def curve_cluster(make_cluster, fleet_keys):
    keys, authorized = fleet_keys
    cluster = await make_cluster(
        curve_secret_key=keys / "router.key_secret", curve_authorized_keys=authorized
    )
    return cluster, keys


def start_worker(cluster, worker_id: str, curve=None) -> FakeWorker:
    config = FakeWorkerConfig(cluster.zmq_endpoint, worker_id, curve=curve, watch_handshake=True)
    worker = FakeWorker(config)
    cluster.workers[worker_id] = (worker, asyncio.create_task(worker.run()))
    return worker


async def test_authorized_worker_registers_and_serves(curve_cluster):
    cluster, keys = curve_cluster
    worker = start_worker(cluster, "a", (keys / "worker-a.key_secret", keys / "router.key"))
    await asyncio.wait_for(worker.registered.wait(), 20)
    resp = await cluster.client.post("/v1/completions", json=COMPLETION)
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["usage"]["completion_tokens"] == 3
    assert len(worker.received) == 1


async def test_unknown_key_and_plain_workers_are_refused_and_get_nothing(curve_cluster, caplog):
    cluster, keys = curve_cluster
    caplog.set_level(logging.INFO, logger="shared.curve")
    stranger = start_worker(cluster, "x", (keys / "stranger.key_secret", keys / "router.key"))
    plain = start_worker(cluster, "p")
    await asyncio.wait_for(stranger.handshake_failed.wait(), 20)
    await asyncio.wait_for(plain.handshake_failed.wait(), 20)
    good = start_worker(cluster, "a", (keys / "worker-a.key_secret", keys / "router.key"))
    await asyncio.wait_for(good.registered.wait(), 20)
    for _ in range(3):
        resp = await cluster.client.post("/v1/completions", json=COMPLETION)
        assert resp.status == 200
    listed = (await (await cluster.client.get("/v1/cluster")).json())["workers"]
    assert [w["id"] for w in listed] == ["a"]
    assert len(good.received) == 3
    assert stranger.received == [] and plain.received == []
    assert not stranger.registered.is_set() and not plain.registered.is_set()
    # Logs name the refused key by fingerprint only.
    stranger_public = load_public(keys / "stranger.key")
    assert f"unknown CURVE key {fingerprint(stranger_public)}" in caplog.text
    assert stranger_public.decode() not in caplog.text


async def test_worker_that_does_not_know_the_router_key_gets_nothing(curve_cluster, tmp_path):
    """The worker checks the router too: with another server key it never handshakes."""
    cluster, keys = curve_cluster
    impostor_public, _ = generate_keypair(tmp_path / "other", "router")
    worker = start_worker(cluster, "a", (keys / "worker-a.key_secret", impostor_public))
    await asyncio.wait_for(worker.handshake_failed.wait(), 20)
    assert not worker.registered.is_set()


def test_router_start_checks_its_curve_files(fleet_keys, tmp_path):
    keys, authorized = fleet_keys
    config = RouterConfig(
        models=(ModelSpec(Path(".")),),
        zmq_bind="tcp://0.0.0.0:5555",
        curve_secret_key=keys / "router.key_secret",
        curve_authorized_keys=authorized,
    )
    check_security(config)
    with pytest.raises(SystemExit, match="not a readable CURVE key file"):
        check_security(dataclasses.replace(config, curve_secret_key=tmp_path / "nope"))
    with pytest.raises(SystemExit, match="no such folder"):
        check_security(dataclasses.replace(config, curve_authorized_keys=tmp_path / "nope"))
