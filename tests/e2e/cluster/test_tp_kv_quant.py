"""`cluster-worker --kv-bits 8` as a 2-rank tensor-parallel group (real processes, a ring over
loopback, driven by a test router socket): no longer refused; it registers the quantized
layout and no KV endpoint (no peer transfer for groups), and answers with the greedy tokens of
a one-process worker with the same --kv-bits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from shared.protocol import Generate
from shared.sampling import SamplingParams
from tests.support.kv_router import Router
from tests.support.tp_group import TINY_TP_QUANT_ARGS, free_ports, save_tiny_model

pytestmark = pytest.mark.slow

QUANT = ["--kv-bits", "8", "--kv-group-size", "32", "--kv-memory", "16MiB", "--block-size", "8"]
GREEDY = SamplingParams(max_tokens=24, temperature=0.0)
PROMPTS = [tuple((7 * i + s) % 97 + 1 for i in range(n)) for s, n in ((1, 45), (2, 9), (3, 70))]


def start(model_dir, router: Router, worker_id: str, log, *extra: str) -> subprocess.Popen:
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
        *QUANT,
        *extra,
    ]
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "OPENBLAS_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)


@pytest.fixture
def workers(tmp_path):
    model_dir = save_tiny_model(tmp_path / "model", seed=5, args=TINY_TP_QUANT_ARGS)
    router = Router()
    log = open(tmp_path / "workers.log", "wb")  # noqa: SIM115
    hosts = ",".join(f"127.0.0.1:{p}" for p in free_ports(2))
    procs = [start(model_dir, router, "solo", log)]
    procs += [
        start(model_dir, router, "group", log, "--tp-hosts", hosts, "--tp-rank", str(rank))
        for rank in (0, 1)
    ]
    try:
        router.pump(lambda: True if len(router.beats) == 2 else None, timeout=240)
        yield router, procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        log.close()
        router.ctx.destroy(linger=0)
        print((tmp_path / "workers.log").read_text()[-4000:])


def test_a_tp2_group_with_8_bit_kv_serves_the_one_process_workers_tokens(workers):
    router, procs = workers
    solo, group = router.registers["solo"], router.registers["group"]
    assert solo.attention.kv_layout == group.attention.kv_layout == "q8g32"
    # a rank's pool holds half the KV heads: half the bytes per token
    assert group.attention.kv_bytes_per_token * 2 == solo.attention.kv_bytes_per_token
    assert group.group.size == 2 and group.kv_endpoint == ""
    for i, prompt in enumerate(PROMPTS):
        solo_tokens = router.run("solo", Generate(f"s{i}", prompt, GREEDY))
        assert router.run("group", Generate(f"g{i}", prompt, GREEDY)) == solo_tokens
        assert len(solo_tokens) == GREEDY.max_tokens
    hit = PROMPTS[0] + (5, 6, 7)  # the first prompt's blocks, cached on both
    assert router.run("group", Generate("g-hit", hit, GREEDY)) == router.run(
        "solo", Generate("s-hit", hit, GREEDY)
    )
    assert router.idle_beat("group").hit_tokens >= 40
    assert all(p.poll() is None for p in procs)
