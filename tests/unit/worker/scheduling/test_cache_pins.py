"""Cache pins end to end (issue 48): Generate messages carrying pins, a tiny random-weight model,
a pool small enough that other traffic evicts what is not pinned."""

from __future__ import annotations

import threading
import time

import pytest

from shared.protocol import CachePin, Generate, Heartbeat, Register, RegisterAck, TokenDelta
from shared.sampling import InvalidRequest, SamplingParams
from tests.support.engine_fixtures import (
    make_engine,
    reference_greedy,
    run_to_completion,
    tiny_model,
)
from tests.support.kv_router import FakeRouter
from worker.loop import WorkerLoop

GREEDY = SamplingParams(max_tokens=4)
PROMPT = [(7 * i + 3) % 97 for i in range(70)]  # 8 full blocks of 8, and a tail
OTHER = [(13 * i + 5) % 97 for i in range(70)]
FIVE_MINUTES, DAY = 300.0, 86400.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=3)


def pinned_engine(model, **overrides):
    """24 blocks of 8 (23 usable, 11 for pins at the default share), a fake clock."""
    engine = make_engine(model, **({"num_blocks": 24} | overrides))
    clock = FakeClock()
    engine.scheduler.kv.pins.clock = clock
    return engine, clock


def submit(engine, msg: Generate) -> None:
    """What the worker loop does with a Generate."""
    engine.add_request(
        msg.request_id,
        list(msg.token_ids),
        msg.sampling,
        msg.n,
        msg.images,
        None,
        msg.priority,
        msg.pins,
    )


def serve(engine, msg: Generate):
    """Run `msg` to its end; (its tokens, its prompt tokens read from the cache)."""
    submit(engine, msg)
    deltas = []
    for _ in range(2000):
        if not engine.has_work():
            break
        deltas += engine.step()
    assert not engine.has_work(), "the request never finished"
    assert all(d.error is None for d in deltas)
    return [t for d in deltas for t in d.token_ids], deltas[-1].usage.cached_tokens


def other_traffic(engine, rounds: int, tag: str) -> None:
    """Prompts of 10 blocks each, `rounds` of them: three fill this pool past what it keeps."""
    for i in range(rounds):
        prompt = [(11 * j + 17 * i + 1) % 97 for j in range(80)]
        engine.add_request(f"{tag}{i}", prompt, GREEDY)
        run_to_completion(engine)
        engine.check_integrity()


def test_an_ephemeral_prefix_is_kept_for_its_ttl_and_evictable_after(model):
    engine, clock = pinned_engine(model)
    pin = CachePin(num_tokens=64, ttl_s=FIVE_MINUTES)  # a cache_control breakpoint
    expected, _ = serve(engine, Generate("a", tuple(PROMPT), GREEDY, pins=(pin,)))
    assert expected == reference_greedy(model, PROMPT, 4)
    assert (engine.stats()["pins"], engine.stats()["pinned_blocks"]) == (1, 8)

    clock.now += FIVE_MINUTES - 1
    other_traffic(engine, 4, "x")  # 40 blocks through a pool of 23
    assert engine.cache.peek_prefix_length(PROMPT) == 64
    tokens, cached = serve(engine, Generate("a2", tuple(PROMPT), GREEDY))
    assert (tokens, cached) == (expected, 64)  # the hit renews nothing: no pin sent

    clock.now += 2  # past the deadline: the next idle tick releases it
    engine.load()
    assert engine.stats()["pins"] == 0 and engine.scheduler.kv.pins.expired == 1
    other_traffic(engine, 4, "y")
    assert engine.cache.peek_prefix_length(PROMPT) == 0
    engine.check_integrity()


def test_without_a_pin_the_same_traffic_evicts_the_prefix(model):
    engine, _ = pinned_engine(model)
    serve(engine, Generate("a", tuple(PROMPT), GREEDY))
    other_traffic(engine, 4, "x")
    assert engine.cache.peek_prefix_length(PROMPT) == 0


def test_a_hit_with_the_pin_renews_its_ttl(model):
    engine, clock = pinned_engine(model)
    pin = CachePin(64, FIVE_MINUTES)
    serve(engine, Generate("a", tuple(PROMPT), GREEDY, pins=(pin,)))
    clock.now += 200
    _, cached = serve(engine, Generate("a2", tuple(PROMPT), GREEDY, pins=(pin,)))
    assert cached == 69  # its full blocks and its tail's tokens: all but the last
    clock.now += 200  # 400 s after the first request, 200 s after the second
    engine.load()
    other_traffic(engine, 4, "x")
    assert engine.cache.peek_prefix_length(PROMPT) == 64
    assert engine.scheduler.kv.pins.deadline(PROMPT, 64) == clock.now - 200 + FIVE_MINUTES


def test_a_24h_retention_survives_pools_of_traffic_then_expires(model):
    engine, clock = pinned_engine(model)
    retention = CachePin(len(PROMPT), DAY)  # prompt_cache_retention "24h": the whole prompt
    expected, _ = serve(engine, Generate("a", tuple(PROMPT), GREEDY, pins=(retention,)))
    for hour in (5, 10, 15, 20):  # other traffic all day: 3 pools' worth each time
        clock.now += 5 * 3600
        engine.load()
        other_traffic(engine, 7, f"h{hour}-")
        assert engine.cache.peek_prefix_length(PROMPT) == 64, hour
    clock.now += 4 * 3600 + 1  # a day and a second after the request
    engine.load()
    other_traffic(engine, 4, "late")
    assert engine.cache.peek_prefix_length(PROMPT) == 0


def test_a_24h_pin_released_for_room_is_written_to_the_disk_tier(model, tmp_path):
    engine, _ = pinned_engine(
        model, kv_disk_bytes=64 << 20, kv_disk_dir=str(tmp_path), pin_share=0.4
    )  # 9 blocks for pins: a second 8-block pin releases the first
    day = (CachePin(len(PROMPT), DAY),)
    expected, _ = serve(engine, Generate("a", tuple(PROMPT), GREEDY, pins=day))
    serve(engine, Generate("b", tuple(OTHER), GREEDY, pins=(CachePin(len(OTHER), DAY),)))
    assert engine.scheduler.kv.pins.released_for_room == 1
    engine.disk.store.flush()
    # written when released, while its blocks are still in memory
    assert engine.cache.peek_prefix_length(PROMPT) == 64
    assert len(engine.disk.find(PROMPT, 0, 8)) == 8
    other_traffic(engine, 4, "x")
    assert engine.cache.peek_prefix_length(PROMPT) == 0  # gone from memory...
    tokens, cached = serve(engine, Generate("a2", tuple(PROMPT), GREEDY))
    assert (tokens, cached) == (expected, 64)  # ...read back from disk
    assert engine.stats()["disk_hit_tokens"] == 64
    engine.check_integrity()


def test_pins_give_way_when_a_request_needs_the_memory(model):
    engine, _ = pinned_engine(model)
    serve(engine, Generate("a", tuple(PROMPT), GREEDY, pins=(CachePin(64, DAY),)))
    long_prompt = [(5 * i + 2) % 97 for i in range(150)]  # 19 blocks + its output: past 23 - 8
    tokens, _ = serve(engine, Generate("long", tuple(long_prompt), GREEDY))
    assert tokens == reference_greedy(model, long_prompt, 4)
    assert engine.scheduler.kv.pins.released_for_room == 1
    engine.check_integrity()


def test_pins_are_bounded_and_ignored_without_prefix_caching(model):
    engine, _ = pinned_engine(model, pin_share=0.0)
    serve(engine, Generate("a", tuple(PROMPT), GREEDY, pins=(CachePin(64, DAY),)))
    assert engine.stats()["pins"] == 0 and engine.scheduler.kv.pins.refused == 1
    engine, _ = pinned_engine(model, enable_prefix_cache=False)
    serve(engine, Generate("a", tuple(PROMPT), GREEDY, pins=(CachePin(64, DAY),)))
    assert (engine.stats()["pins"], engine.scheduler.kv.pins.refused) == (0, 0)
    engine.check_integrity()


@pytest.mark.parametrize(
    ("pin", "says"),
    [
        (CachePin(71, 60.0), "num_tokens"),
        (CachePin(0, 60.0), "num_tokens"),
        (CachePin(8, 0.0), "ttl_s"),
        (CachePin(8, float("inf")), "ttl_s"),
    ],
)
def test_a_pin_that_cannot_be_the_prompts_is_refused(model, pin, says):
    engine, _ = pinned_engine(model)
    with pytest.raises(InvalidRequest, match=says):
        submit(engine, Generate("bad", tuple(PROMPT), GREEDY, pins=(pin,)))
    assert not engine.has_work()


def test_the_worker_loop_takes_pins_from_generate_and_reports_them(model):
    router = FakeRouter()
    server = WorkerLoop(make_engine(model), router.endpoint, "w-pins", "tiny")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        router.recv_until(Register)
        router.send(RegisterAck(accepted=True, heartbeat_interval_s=0.1))
        router.send(Generate("p", tuple(PROMPT), GREEDY, pins=(CachePin(64, FIVE_MINUTES),)))
        while not router.recv_until(TokenDelta).finish_reason:
            pass
        deadline = time.monotonic() + 10
        beat = router.recv_until(Heartbeat)
        while beat.pins == 0:
            assert time.monotonic() < deadline, "no pin in the heartbeats"
            beat = router.recv_until(Heartbeat)
        assert (beat.pins, beat.pinned_blocks) == (1, 8)
    finally:
        server.stop()
        thread.join(timeout=5)
        router.close()
