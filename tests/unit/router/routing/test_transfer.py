"""The fleet cache's cost model: pull a prefix from its holder, or recompute it."""

from __future__ import annotations

import pytest

from router.cluster.registry import WorkerRegistry, WorkerState
from router.routing.affinity import PrefixAffinity
from router.routing.choose import LOCAL_HIT, PULL, RECOMPUTE, choose
from router.routing.policy import CacheAwarePolicy
from router.routing.prefix_index import PrefixIndex
from router.routing.transfer import DEFAULT_PREFILL_TOKENS_PER_S, link, plan_pull, prefill_rate
from shared.hashing import ROOT_PARENT_HASH, hash_blocks
from shared.kv_events import BlockStored
from shared.protocol import AttentionReport, Heartbeat, LinkRate, Peer, PullHint, Register

BLOCK = 4
BYTES_PER_TOKEN = 1000  # 4 kB a block
PROMPT = list(range(100, 180))  # 20 blocks


def make_worker(
    worker_id,
    load=0,
    links=(),
    prefill=200.0,
    layout="float32",
    endpoint="auto",
    model="m",
    role="both",
) -> WorkerState:
    endpoint = f"tcp://127.0.0.1:7{worker_id}" if endpoint == "auto" else endpoint
    attention = AttentionReport("mlx", "auto", kv_layout=layout, kv_bytes_per_token=BYTES_PER_TOKEN)
    info = Register(
        worker_id, model, BLOCK, 1000, "h", 1, attention=attention, kv_endpoint=endpoint, role=role
    )
    state = WorkerState(info, worker_id.encode(), 0.0)
    beat = Heartbeat(
        worker_id, load, 0, 1000, 1000, 0, 0, links=links, prefill_tokens_per_s=prefill
    )
    state.on_heartbeat(beat)
    return state


def holding(index: PrefixIndex, worker: WorkerState, blocks: int) -> None:
    hashes = hash_blocks(PROMPT, BLOCK)
    for i in range(blocks):
        parent = hashes[i - 1] if i else ROOT_PARENT_HASH
        tokens = tuple(PROMPT[i * BLOCK : (i + 1) * BLOCK])
        index.apply(worker.worker_id, BlockStored(hashes[i], parent, tokens, BLOCK))


def route(workers, index, pulls=True, policy=None):
    policy = policy or CacheAwarePolicy(prefill_weight=1.0)
    return choose(policy, index, PrefixAffinity(), PROMPT, workers, pulls=pulls)


FAST = 1e9  # bytes/s: 20 blocks of 4 kB in ~0.1 ms


def test_busy_holder_the_idle_worker_pulls():
    index = PrefixIndex()
    holder = make_worker("a", load=6)
    idle = make_worker("b", links=(LinkRate("a", FAST, 0.001),))
    holding(index, holder, 20)
    choice = route([holder, idle], index)
    assert choice.worker is idle and choice.kind == PULL
    assert choice.hint == PullHint("a", holder.kv_endpoint, 20)
    assert choice.pull.pull_s < 0.01 < choice.pull.recompute_s  # 80 tokens at 200/s = 0.4 s
    # without pulls, recomputing 20 blocks (cost 20) loses to waiting behind 6 requests
    assert route([holder, idle], index, pulls=False).worker is holder


def test_slow_link_recomputes():
    index = PrefixIndex()
    holder, idle = make_worker("a", load=6), make_worker("b", links=(LinkRate("a", 1000.0),))
    holding(index, holder, 20)
    assert plan_pull(idle, 0, [(holder, 20)]) is None  # 80 s on the wire vs 0.4 s of prefill
    assert route([holder, idle], index).pull is None


def test_unknown_rates_recompute():
    index = PrefixIndex()
    holder, idle = make_worker("a", load=6), make_worker("b")
    holding(index, holder, 20)
    assert link(idle, holder) is None and plan_pull(idle, 0, [(holder, 20)]) is None
    choice = route([holder, idle], index)
    assert choice.pull is None
    unmeasured = make_worker("c", prefill=0.0)
    assert prefill_rate(unmeasured) == DEFAULT_PREFILL_TOKENS_PER_S


def test_a_link_measured_one_way_stands_for_the_other():
    holder = make_worker("a", load=6, links=(LinkRate("b", FAST),))  # a measured fetching from b
    idle = make_worker("b")
    assert link(idle, holder).bytes_per_s == FAST
    assert plan_pull(idle, 0, [(holder, 20)]).holder == "a"


def test_different_kv_layouts_never_pull_from_each_other():
    index = PrefixIndex()
    holder = make_worker("a", load=6, layout="q8g64")
    idle = make_worker("b", links=(LinkRate("a", FAST),))
    holding(index, holder, 20)
    assert plan_pull(idle, 0, [(holder, 20)]) is None
    choice = route([holder, idle], index)
    assert choice.pull is None
    # the index keeps each worker's blocks apart: the other layout's prefix is no hit here
    assert index.match(hash_blocks(PROMPT, BLOCK), ["b"]) == {"b": 0}


def test_a_holder_without_kv_endpoint_is_not_pulled_from():
    holder = make_worker("a", load=6, endpoint="")
    idle = make_worker("b", links=(LinkRate("a", FAST),))
    assert plan_pull(idle, 0, [(holder, 20)]) is None


def test_pull_only_the_blocks_beyond_those_held():
    index = PrefixIndex()
    holder = make_worker("a", load=6)
    idle = make_worker("b", links=(LinkRate("a", FAST),))
    holding(index, holder, 20)
    holding(index, idle, 12)
    choice = route([holder, idle], index)
    assert choice.kind == PULL and choice.matched == 12
    assert (choice.pull.blocks, choice.pull.gained) == (20, 8)


def test_optimistic_entries_are_not_pulled_from():
    index = PrefixIndex()
    holder = make_worker("a", load=6)
    idle = make_worker("b", links=(LinkRate("a", FAST),))
    index.add_optimistic("a", hash_blocks(PROMPT, BLOCK))  # a prefill in flight, not cached yet
    assert route([holder, idle], index).pull is None


def test_decision_kinds():
    index = PrefixIndex()
    a = make_worker("a")
    assert route([a], index).kind == RECOMPUTE
    holding(index, a, 20)
    assert route([a], index).kind == LOCAL_HIT


def test_balance_guard_sends_to_the_idle_worker_which_pulls():
    index = PrefixIndex()
    policy = CacheAwarePolicy(prefill_weight=10, balance_abs_threshold=4)
    holder = make_worker("a", load=12)
    idle = make_worker("b", links=(LinkRate("a", FAST),))
    holding(index, holder, 20)
    choice = route([holder, idle], index, policy=policy)
    assert choice.worker is idle and choice.kind == PULL


def test_prefill_workers_are_holders_not_candidates():
    index = PrefixIndex()
    prefill = make_worker("p", role="prefill")
    decode = make_worker("d", role="decode", links=(LinkRate("p", FAST),))
    holding(index, prefill, 20)
    choice = route([prefill, decode], index)
    assert choice.worker is decode and choice.hint.worker_id == "p"


@pytest.mark.parametrize(
    ("other", "peer"),
    [
        ({}, True),
        ({"layout": "q8g64"}, False),
        ({"endpoint": ""}, False),
        ({"model": "other"}, False),
    ],
)
def test_peers_in_register_ack_are_same_model_and_layout_with_endpoint(other, peer):
    registry = WorkerRegistry()
    a, b = make_worker("a"), make_worker("b", **other)
    registry.add(a)
    registry.add(b)
    expected = (Peer("b", b.kv_endpoint),) if peer else ()
    assert registry.peers_of(a) == expected
    b.healthy = False
    assert registry.peers_of(a) == ()


def test_an_idle_holder_whose_heartbeat_is_late_keeps_its_prefix():
    """A request of ours ended after the holder's last heartbeat: that heartbeat still shows it
    running, but the holder is idle, so its prefix's next request stays there (no pull)."""
    index = PrefixIndex()
    holder = make_worker("a", load=1)
    other = make_worker("b", links=(LinkRate("a", FAST, 0.001),))  # a pull would be cheap
    holding(index, holder, 20)
    holder.inflight.add("r1")
    assert holder.load == 1
    holder.untrack("r1")  # its last delta came; the heartbeat saying "running 1" is older
    assert holder.load == 0
    assert route([holder, other], index).worker is holder
    holder.on_heartbeat(Heartbeat("a", 0, 0, 1000, 1000, 0, 0))
    assert (holder.load, holder.ended_since_heartbeat) == (0, 0)
