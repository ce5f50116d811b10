"""Property: the router's prefix index, fed only the worker's KV events, predicts exactly the hit
the worker's admission then takes (shared/prefix/hit_rule.py is the one rule both apply), for full
attention (prompts ending anywhere, so partial tails are hit too), sliding windows (pages
taken back under pressure), chunked attention (Llama 4: pages from a hit's chunk start; chunks
of 3 blocks), hybrids (state snapshots) and both at once (baichuan_m1), through random prompts
over shared prefixes and the evictions a small pool forces."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.routing.prefix_index import PrefixIndex
from shared.hashing import hash_blocks
from shared.sampling import SamplingParams
from tests.support.arch_zoo import build
from tests.support.engine_fixtures import make_engine, tiny_model

BLOCK = 8
CHUNK_OF_3 = dict(attention_chunk_size=3 * BLOCK)  # llama4's chunks, 3 blocks each
KINDS = {  # (model, engine settings): small pools, so that eviction happens
    "full": (lambda: tiny_model("llama", seed=5), dict(num_blocks=40)),
    "window": (lambda: build("gemma3_text"), dict(num_blocks=48, prefill_chunk=16)),
    "chunk": (lambda: build("llama4", **CHUNK_OF_3), dict(num_blocks=48, prefill_chunk=16)),
    "hybrid": (lambda: build("qwen3_next"), dict(num_blocks=64, prefill_chunk=64)),
    "window+hybrid": (lambda: build("baichuan_m1"), dict(num_blocks=64, prefill_chunk=32)),
}
_ENGINES: dict[str, tuple] = {}


def engine_and_index(kind: str):
    """One engine and the index following it per kind, kept across examples: the history
    they share is part of what is drawn."""
    if kind not in _ENGINES:
        make_model, settings_ = KINDS[kind]
        engine = make_engine(make_model(), **settings_)
        index = PrefixIndex()
        rule = engine.scheduler.kv.rule  # what the worker registers (worker/loop.py)
        index.set_window("w", rule.window_blocks, rule.chunk_blocks)
        index.set_snapshots("w", engine.states is not None)
        _ENGINES[kind] = (engine, index)
    return _ENGINES[kind]


PREFIXES = [[(7 * i + 3 * p) % 89 + 2 for i in range(40)] for p in range(3)]
requests = st.lists(
    st.tuples(
        st.integers(0, len(PREFIXES) - 1),  # which shared prefix
        st.integers(0, 40),  # how much of it
        st.lists(st.integers(2, 90), min_size=1, max_size=30),  # then its own tokens
        st.booleans(),  # windows: take every spare page back first
    ),
    min_size=1,
    max_size=6,
)


@pytest.mark.parametrize("kind", list(KINDS))
@settings(
    max_examples=12,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(drawn=requests)
def test_the_router_predicts_the_hit_the_worker_takes(kind, drawn):
    engine, index = engine_and_index(kind)
    for prefix, length, own, squeeze in drawn:
        if squeeze and engine.pool.pages is not None:
            engine.pool.pages.make_free(engine.pool.num_blocks)  # BlockWindowsDropped
        for event in engine.drain_kv_events():
            index.apply("w", event)
        tokens = PREFIXES[prefix][:length] + own
        predicted = index.match(hash_blocks(tokens[:-1], BLOCK), ["w"])["w"]
        rid = f"r{id(tokens)}-{len(tokens)}"
        engine.add_request(rid, tokens, SamplingParams(max_tokens=2))
        usage = None
        while engine.has_work():
            for delta in engine.step():
                assert delta.error is None, delta.error
                if delta.request_id == rid and delta.finish_reason:
                    usage = delta.usage
        assert usage is not None
        # the worker may add a partial tail (< one block) the index does not track
        assert usage.cached_tokens // BLOCK == predicted, (kind, usage, predicted)
        engine.check_integrity()


def test_pages_taken_back_before_the_tree_has_the_block_are_told():
    """A running prompt's blocks behind its window go spare before the tree stores them; taken
    back then, no node names them yet, so the drop is told right after their BlockStored (the
    router would otherwise predict hits through pages that are gone)."""
    engine = make_engine(build("gemma3_text"), num_blocks=48, prefill_chunk=8)
    index = PrefixIndex()
    index.set_window("w", engine.pool.pages.blocks_before_match)
    tokens = PREFIXES[1][:40] + [5]
    engine.add_request("r", tokens, SamplingParams(max_tokens=2))
    while engine.has_work():
        engine.step()
        engine.pool.pages.make_free(engine.pool.num_blocks)  # mid-prefill: spare pages go
    for event in engine.drain_kv_events():
        index.apply("w", event)
    match = engine.cache.match_prefix(tokens)
    assert not all(engine.pool.pages.has_page(b) for b in match.block_ids)  # the case arose
    predicted = index.match(hash_blocks(tokens[:-1], BLOCK), ["w"])["w"]
    assert predicted == engine.pool.pages.usable_blocks(match.block_ids)
