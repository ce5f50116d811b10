"""Disaggregated prefill through two WorkerLoops on real sockets: a prefill-only request on
one worker answers one "prefilled" delta and leaves its blocks cached; the other worker pulls
them and decodes the greedy output a single worker computes."""

from __future__ import annotations

import threading

import pytest

from shared.kv_events import BlockStored
from shared.protocol import Abort, Generate, KVEvents, PullHint
from shared.sampling import SamplingParams
from tests.support.engine_fixtures import make_engine, reference_greedy, tiny_model
from tests.support.kv_router import Router
from worker.loop import WorkerLoop
from worker.peer.channel import PeerChannel

PROMPT = tuple((11 * i + 4) % 97 for i in range(45))  # 5 full blocks of 8 and a tail
GREEDY = SamplingParams(max_tokens=6, temperature=0.0)


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=9)


@pytest.fixture
def fleet(model):
    router = Router()
    loops = {
        wid: WorkerLoop(
            make_engine(model),
            router.endpoint,
            wid,
            "tiny",
            role=role,
            peers=PeerChannel("tcp://127.0.0.1:0"),
        )
        for wid, role in (("p", "prefill"), ("d", "decode"))
    }
    threads = [threading.Thread(target=w.serve_forever, daemon=True) for w in loops.values()]
    for t in threads:
        t.start()
    try:
        router.pump(lambda: True if len(router.beats) == 2 else None, timeout=30)
        yield router, loops
    finally:
        for w in loops.values():
            w.stop()
        for t in threads:
            t.join(timeout=10)
        router.ctx.destroy(linger=0)


def test_prefill_worker_then_decode_worker_pull(model, fleet):
    router, loops = fleet
    assert router.registers["p"].role == "prefill" and router.registers["d"].role == "decode"
    router.send("p", Generate("pre", PROMPT, GREEDY, prefill_only=True))
    [done] = router.pump(lambda: router._finished("pre"), timeout=30)
    assert done.finish_reason == "prefilled" and done.token_ids == ()
    assert done.usage.prompt_tokens == len(PROMPT) and done.usage.completion_tokens == 0
    beat = router.idle_beat("p")
    # 5 full blocks; the prompt's partial last block is kept as a tail (evictable, not pulled)
    assert beat.cached_blocks == 5 and beat.evictable_blocks == 6 and beat.running == 0
    assert beat.prefill_tokens_per_s > 0
    hint = PullHint("p", router.registers["p"].kv_endpoint, 5)
    out = router.run("d", Generate("dec", PROMPT, GREEDY, pull=hint), timeout=30)
    assert out == reference_greedy(model, list(PROMPT), 6)
    beat = router.idle_beat("d")
    assert beat.pulled_blocks == 5 and beat.pull_failures == 0 and beat.hit_tokens == 40
    for loop in loops.values():  # idle: every block free or cached, none held
        loop.engine.pool.check_integrity()
        loop.engine.cache.check_integrity()


def test_abort_of_a_prefill_only_request(fleet):
    router, loops = fleet
    long = tuple(i % 97 for i in range(400))
    router.send("p", Generate("pre", long, GREEDY, prefill_only=True))
    router.send("p", Abort("pre"))
    router.run("p", Generate("after", PROMPT, GREEDY), timeout=30)  # still serving
    assert all(d.finish_reason != "prefilled" for d in router.deltas.get("pre", []))
    assert "pre" not in loops["p"].live and not loops["p"].live


def test_kv_events_of_a_prefill(fleet):
    router, _ = fleet
    events = []
    router.on_other = lambda msg: events.extend(msg.events if isinstance(msg, KVEvents) else ())
    router.send("p", Generate("pre", PROMPT, GREEDY, prefill_only=True))
    router.pump(lambda: router._finished("pre"), timeout=30)
    router.idle_beat("p")
    assert len([e for e in events if isinstance(e, BlockStored)]) == 5
