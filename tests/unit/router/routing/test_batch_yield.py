"""Batch lines yield to live traffic at the router (issue 50): a worker that served an
interactive request within `batch_yield_s` takes only a quarter of `batch_lines_per_worker`
batch lines, as while one runs, so a client sending requests one after another does not find
a full worker's worth of batch prefills in front of each; and a live request, between workers
equal in cache and load, goes to the one with fewer batch rows. Time is a fake clock."""

from __future__ import annotations

import pytest

from router.cluster.registry import WorkerRegistry, WorkerState
from router.metrics.router_metrics import Metrics
from router.routing.dispatcher import Dispatcher, Overloaded
from router.routing.policy import CacheAwarePolicy, Candidate, make_policy
from router.routing.prefix_index import PrefixIndex
from shared.hashing import hash_blocks
from shared.kv_events import BlockStored
from shared.protocol import BATCH, Register, TokenDelta, Usage
from shared.sampling import SamplingParams

BLOCK = 4
PER_WORKER = 8  # batch_lines_per_worker: a quarter of it is 2


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def fleet(batch_yield_s: float = 2.0, workers: int = 2):
    registry, index, clock = WorkerRegistry(), PrefixIndex(ttl_s=0.0), Clock()
    for i in range(workers):
        name = f"w{i}"
        registry.add(WorkerState(Register(name, "m", BLOCK, 1000, "h", 1), name.encode(), 0.0))
    dispatcher = Dispatcher(
        registry,
        index,
        make_policy("cache_aware"),
        lambda ident, msg: None,
        Metrics().model("model"),
        max_pending=1000,
        max_resubmits=1,
        batch_yield_s=batch_yield_s,
        clock=clock,
    )
    return registry, index, dispatcher, clock


def prompt(k: int) -> list[int]:
    return [1000 * k + i for i in range(8 * BLOCK)]


def live(dispatcher, k: int):
    return dispatcher.start(f"live{k}", prompt(k), SamplingParams(max_tokens=4))


def batch_line(dispatcher, k: int):
    return dispatcher.start(
        f"line{k}", prompt(k), SamplingParams(max_tokens=4), priority=BATCH, per_worker=PER_WORKER
    )


def finish(registry, dispatcher, job) -> None:
    worker = registry.get(job.worker_id)
    dispatcher.on_delta(worker, TokenDelta(job.wire_id, (1,), "stop", Usage(8 * BLOCK, 1, 0)))


def cache(index, worker_id: str, k: int) -> None:
    """Worker `worker_id` holds prompt(k) (a KV event said so)."""
    hashes = hash_blocks(prompt(k), BLOCK)
    for i, h in enumerate(hashes):
        index.apply(worker_id, BlockStored(h, hashes[i - 1] if i else 0, (0,) * BLOCK, BLOCK))


def test_a_worker_keeps_the_small_bound_for_batch_yield_s_after_a_live_request():
    registry, _, dispatcher, clock = fleet(workers=1)
    assert dispatcher.batch_room(PER_WORKER) == 8
    job = live(dispatcher, 0)
    assert dispatcher.batch_room(PER_WORKER) == 2  # while it runs
    finish(registry, dispatcher, job)
    # a client sending its next request a moment later finds at most 2 lines there...
    assert dispatcher.batch_room(PER_WORKER) == 2
    clock.now += 1.9
    assert dispatcher.batch_room(PER_WORKER) == 2
    clock.now += 0.1  # ...and once live traffic has stopped that long, the batch fills it
    assert dispatcher.batch_room(PER_WORKER) == 8


def test_batch_yield_of_zero_frees_the_worker_when_its_live_request_ends():
    registry, _, dispatcher, _ = fleet(batch_yield_s=0.0, workers=1)
    job = live(dispatcher, 0)
    assert dispatcher.batch_room(PER_WORKER) == 2
    finish(registry, dispatcher, job)
    assert dispatcher.batch_room(PER_WORKER) == 8


def test_a_batch_line_ending_does_not_count_as_live_traffic():
    registry, _, dispatcher, _ = fleet(workers=1)
    line = batch_line(dispatcher, 0)
    assert dispatcher.batch_room(PER_WORKER) == 7
    finish(registry, dispatcher, line)
    assert dispatcher.batch_room(PER_WORKER) == 8


def test_batch_lines_fill_the_quiet_worker_and_trickle_beside_the_recent_one():
    registry, _, dispatcher, clock = fleet()
    job = live(dispatcher, 0)
    finish(registry, dispatcher, job)  # (no live request runs anywhere now)
    lines = [batch_line(dispatcher, 100 + k) for k in range(10)]
    placed = sorted(line.worker_id for line in lines)
    assert placed.count(job.worker_id) == 2 and len(placed) == 10
    with pytest.raises(Overloaded):  # no room left anywhere
        batch_line(dispatcher, 200)
    clock.now += 2.0
    assert dispatcher.batch_room(PER_WORKER) == 6  # the recent worker's yield has run out
    assert batch_line(dispatcher, 201).worker_id == job.worker_id


def test_a_cancelled_live_request_counts_as_live_traffic():
    _, _, dispatcher, _ = fleet(workers=1)
    job = live(dispatcher, 0)
    job.cancel()  # the client left before its answer: it was a person, all the same
    assert dispatcher.batch_room(PER_WORKER) == 2


def test_equal_cost_and_load_a_live_request_goes_where_fewer_batch_rows_run():
    rotating = [Candidate("a", 2, 0, 8, batch_rows=2), Candidate("b", 2, 0, 8, batch_rows=1)]
    policy = CacheAwarePolicy()
    assert [policy.choose(rotating).worker_id for _ in range(4)] == ["b"] * 4
    # load and cache still come first: batch rows only break their ties
    busier = [Candidate("a", 1, 0, 8, batch_rows=1), Candidate("b", 2, 0, 8, batch_rows=0)]
    assert policy.choose(busier).worker_id == "a"


def test_the_dispatcher_tells_the_policy_the_batch_rows_of_each_worker():
    """w0 runs a live request and one batch line, w1 two batch lines (each placed by what its
    cache holds): equal load, so live requests new to both go to w0, every time (without the
    batch rows the policy would alternate between the two)."""
    registry, index, dispatcher, _ = fleet()
    for worker_id, k in (("w0", 0), ("w1", 1), ("w0", 2), ("w1", 3)):
        cache(index, worker_id, k)
    assert live(dispatcher, 0).worker_id == "w0"
    assert [batch_line(dispatcher, k).worker_id for k in (1, 2, 3)] == ["w1", "w0", "w1"]
    for k in range(10, 14):
        job = live(dispatcher, k)
        assert job.worker_id == "w0"
        finish(registry, dispatcher, job)
