"""Workers of one model with different KV layouts (`--kv-bits`) hold different caches: the
router's prefix index credits a block to the worker whose KV event announced it, never to
another worker that would hash the same tokens the same way, so a q8 worker's blocks never
draw a request to a float32 worker (or back), whatever the order of events."""

from __future__ import annotations

from router.cluster.registry import WorkerRegistry, WorkerState
from router.metrics.router_metrics import Metrics
from router.routing.dispatcher import Dispatcher
from router.routing.policy import make_policy
from router.routing.prefix_index import PrefixIndex
from shared.hashing import hash_blocks
from shared.kv_events import BlockRemoved, BlockStored
from shared.protocol import AttentionReport, Register, TokenDelta, Usage
from shared.sampling import SamplingParams

BLOCK = 4
LAYOUTS = {"q8": ("q8g64", 720), "f32": ("float32", 2560)}


def cluster():
    registry, index, sent = WorkerRegistry(), PrefixIndex(ttl_s=0.0), []
    for name, (layout, per_token) in LAYOUTS.items():
        report = AttentionReport(
            "mlx", "auto", "not run", kv_layout=layout, kv_bytes_per_token=per_token
        )
        registry.add(
            WorkerState(
                Register(name, "m", BLOCK, 1000, "h", 1, attention=report), name.encode(), 0.0
            )
        )
    dispatcher = Dispatcher(
        registry,
        index,
        make_policy("cache_aware"),
        lambda ident, msg: sent.append(msg),
        Metrics().model("model"),
        max_pending=100,
        max_resubmits=1,
    )
    return registry, index, dispatcher


def store(index, worker_id, tokens):
    hashes = hash_blocks(tokens, BLOCK)
    for i, h in enumerate(hashes):
        index.apply(worker_id, BlockStored(h, hashes[i - 1] if i else 0, (0,) * BLOCK, BLOCK))
    return hashes


def route(registry, dispatcher, request_id, tokens) -> str:
    job = dispatcher.start(request_id, tokens, SamplingParams(max_tokens=1))
    worker = registry.get(job.worker_id)
    dispatcher.on_delta(worker, TokenDelta(job.wire_id, (), "stop", Usage(len(tokens), 0, 0)))
    return job.worker_id


def test_the_same_tokens_cached_in_two_layouts_are_two_caches():
    registry, index, dispatcher = cluster()
    a, b = list(range(100, 140)), list(range(500, 540))
    hashes_a = store(index, "q8", a)
    store(index, "f32", b)
    assert registry.get("q8").kv_layout == "q8g64" and registry.get("f32").kv_layout == "float32"
    assert index.match(hashes_a, ["q8", "f32"]) == {"q8": 10, "f32": 0}
    assert route(registry, dispatcher, "r1", a) == "q8"
    assert route(registry, dispatcher, "r2", b) == "f32"
    # the float32 worker computes A too: each holds its own copy, in its own layout
    store(index, "f32", a)
    assert index.match(hashes_a, ["q8", "f32"]) == {"q8": 10, "f32": 10}
    # the q8 worker evicts A: the router no longer credits it, and f32's copy is untouched
    index.apply("q8", BlockRemoved(tuple(hashes_a)))
    assert index.match(hashes_a, ["q8", "f32"]) == {"q8": 0, "f32": 10}
    assert route(registry, dispatcher, "r3", a) == "f32"
