"""Peer block transfer between two real worker processes, driven by a test router socket:
a pulled prefix gives the recomputed greedy output, a holder killed mid-transfer leaves the
request to be computed, garbage and foreign-model fetches on the KV channel are refused and
the worker keeps serving, and no block is left held on either side."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import zmq

from shared.kv_transfer import FetchBlocks
from shared.kv_transfer import decode as kv_decode
from shared.kv_transfer import encode as kv_encode
from shared.protocol import Generate, Heartbeat, Peer, PullHint, RegisterAck
from shared.sampling import SamplingParams
from tests.support.kv_router import Router
from tests.support.tp_group import save_tiny_model

pytestmark = pytest.mark.slow

BLOCK = 8
PROMPT = tuple((5 * i + 2) % 97 for i in range(203))  # 25 full blocks and a tail
GREEDY = SamplingParams(max_tokens=8, temperature=0.0)
PULL_TIMEOUT_S = 2.0  # a pull on loopback takes milliseconds; the default 8 s is waited out twice


def start_worker(model_dir, router: Router, worker_id: str, log) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "worker",
        "--router",
        router.endpoint,
        "--model",
        str(model_dir),
        "--worker-id",
        worker_id,
        "--kv-memory",
        "16MiB",
        "--block-size",
        str(BLOCK),
        # a pull from the killed holder fails when this runs out: the test waits it out
        "--kv-peer-timeout",
        str(PULL_TIMEOUT_S),
    ]
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    return subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )


@pytest.fixture
def cluster(tmp_path):
    model_dir = save_tiny_model(tmp_path / "model", seed=3)
    router = Router()
    log = open(tmp_path / "workers.log", "wb")  # noqa: SIM115
    procs = {w: start_worker(model_dir, router, w, log) for w in ("a", "b")}
    try:
        router.pump(lambda: True if len(router.beats) == 2 else None, timeout=240)
        yield router, procs
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        log.close()
        router.ctx.destroy(linger=0)
        print((tmp_path / "workers.log").read_text()[-4000:])


def no_block_held(beat: Heartbeat) -> None:
    assert beat.running == 0 and beat.waiting == 0
    assert beat.free_blocks + beat.evictable_blocks == beat.total_blocks


def test_pull_equals_recompute_and_garbage_is_refused(cluster):
    router, procs = cluster
    a_kv = router.registers["a"].kv_endpoint
    assert a_kv.startswith("tcp://127.0.0.1:") and router.registers["b"].kv_endpoint
    computed = router.run("a", Generate("warm", PROMPT, GREEDY))
    # garbage and a foreign model's fetch on a's KV channel: refused, a keeps serving
    ctx = zmq.Context()
    for frame in (
        b"\x93garbage",
        kv_encode(FetchBlocks("f", PROMPT[:16], 0, (1, 2), "other-model")),
    ):
        sock = ctx.socket(zmq.DEALER)
        sock.connect(a_kv)
        sock.send(frame)
        assert sock.poll(10_000), "no answer on the KV channel"
        assert kv_decode(sock.recv()).error
        sock.close(linger=0)
    ctx.destroy(linger=0)
    pulled = router.run("b", Generate("pull", PROMPT, GREEDY, pull=PullHint("a", a_kv, 25)))
    assert pulled == computed
    beat = router.idle_beat("b")
    assert beat.pulled_blocks == 25 and beat.pull_failures == 0
    assert beat.hit_tokens == 25 * BLOCK and beat.links[0].peer_id == "a"
    no_block_held(beat)
    no_block_held(router.idle_beat("a"))
    # the router hands out peers: b probes its link to a
    router.send("b", RegisterAck(True, heartbeat_interval_s=0.2, peers=(Peer("a", a_kv),)))
    link = router.pump(
        lambda: (
            next(iter(router.beats["b"].links), None)
            if router.beats["b"].links and router.beats["b"].links[0].latency_s > 0
            else None
        ),
        30,
    )
    assert link.bytes_per_s > 1e6


def test_holder_killed_mid_transfer_falls_back_to_recompute(cluster):
    router, procs = cluster
    a_kv = router.registers["a"].kv_endpoint
    computed = router.run("a", Generate("warm", PROMPT, GREEDY))
    router.send("b", Generate("pull", PROMPT, GREEDY, pull=PullHint("a", a_kv, 25)))
    procs["a"].send_signal(signal.SIGKILL)
    deltas = router.pump(lambda: router._finished("pull"), timeout=120)
    assert [t for d in deltas for t in d.token_ids] == computed
    beat = router.idle_beat("b")
    assert beat.pulled_blocks + beat.pull_failures >= 1  # killed before or after its reply
    no_block_held(beat)
    # and b still pulls nothing from the dead holder, computing each time
    other = tuple((3 * i + 1) % 97 for i in range(100))
    router.run("b", Generate("again", other, GREEDY, pull=PullHint("a", a_kv, 12)))
    assert router.idle_beat("b").pull_failures >= 1
    no_block_held(router.idle_beat("b"))
