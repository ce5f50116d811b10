"""Partial blocks reused by copy-on-write through the engine: a chat's turn 2 extends turn 1's
prompt and reply past a partial block; its greedy output stays mlx-lm's, the copied tokens are
counted (`partial_hit_tokens`, the usage's cached tokens) and the router hears of full blocks
only."""

from __future__ import annotations

import pytest

from shared.kv_events import BlockStored
from shared.sampling import SamplingParams
from tests.support.engine_fixtures import (
    make_engine,
    reference_greedy,
    tiny_model,
    tiny_quantizable_model,
)
from tests.support.engine_fixtures import random_prompt as tokens

BS = 8
REPLY = 12
GREEDY = SamplingParams(max_tokens=REPLY)


def run(engine, request_id: str, prompt: list[int]):
    """One request to completion: its tokens and usage."""
    engine.add_request(request_id, prompt, GREEDY)
    out, usage = [], None
    while engine.has_work():
        for delta in engine.step():
            assert delta.error is None, delta.error
            out += delta.token_ids
            usage = delta.usage or usage
    return out, usage


def two_turns(engine, turn1: list[int]):
    """Turn 1, then turn 2 = turn 1's prompt + reply + a new user message."""
    reply1, _ = run(engine, "turn1", turn1)
    turn2 = turn1 + reply1 + tokens(6, 99)
    reply2, usage2 = run(engine, "turn2", turn2)
    return turn2, reply1, reply2, usage2


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


@pytest.mark.parametrize("prompt_len", [20, 22, 25])
def test_turn_two_reuses_the_partial_block_and_matches_mlx_lm(model, prompt_len):
    engine = make_engine(model, block_size=BS)
    turn1 = tokens(prompt_len, prompt_len)
    turn2, reply1, reply2, usage2 = two_turns(engine, turn1)
    assert reply1 == reference_greedy(model, turn1, REPLY)
    assert reply2 == reference_greedy(model, turn2, REPLY)
    # turn 1's K/V: its prompt and all but its last reply token (never fed back)
    known = prompt_len + REPLY - 1
    assert usage2.cached_tokens == known
    assert engine.stats()["partial_hit_tokens"] == known % BS
    engine.check_integrity()


def test_the_router_hears_of_full_blocks_only(model):
    engine = make_engine(model, block_size=BS)
    two_turns(engine, tokens(20, 1))
    stored = [e for e in engine.kv_events.drain() if isinstance(e, BlockStored)]
    assert stored and all(len(e.token_ids) == BS for e in stored)
    assert len(engine.cache.partials) >= 1  # the tails are beside the tree, not in it
    # nothing evicted: one event per full block, none for a tail
    assert len(stored) == engine.cache.cached_blocks


def test_shared_system_prompt_copies_the_block_it_diverges_in(model):
    """Two users after one system prompt: the second copies the first's block holding the
    end of the system prompt (a child's full block), computing only from its own message."""
    engine = make_engine(model, block_size=BS)
    system = tokens(27, 5)
    first, second = system + tokens(10, 6), system + tokens(9, 7)
    run(engine, "first", first)
    out, usage = run(engine, "second", second)
    assert out == reference_greedy(model, second, REPLY)
    assert usage.cached_tokens == len(system)
    assert engine.stats()["partial_hit_tokens"] == len(system) % BS
    engine.check_integrity()


def test_no_partial_reuse_without_the_prefix_cache(model):
    engine = make_engine(model, block_size=BS, enable_prefix_cache=False)
    turn2, _, reply2, usage2 = two_turns(engine, tokens(20, 3))
    assert reply2 == reference_greedy(model, turn2, REPLY)
    assert usage2.cached_tokens == 0
    assert engine.stats()["partial_hit_tokens"] == 0
    assert len(engine.cache.partials) == 0


def test_tails_are_evicted_under_pressure(model):
    """A small pool: tails count as evictable and go first; every request still finishes
    with mlx-lm's output and the books balance."""
    engine = make_engine(model, block_size=BS, num_blocks=12)
    for i in range(6):
        prompt = tokens(21 + i, 40 + i)
        out, _ = run(engine, f"r{i}", prompt)
        assert out == reference_greedy(model, prompt, REPLY)
        engine.check_integrity()
    assert engine.cache.evicted_blocks > 0


def test_quantized_pool_copies_packed_values():
    """--kv-bits: the copied block carries the packed values, scales and biases, so turn 2
    decodes exactly as a cold engine with the same layout does."""
    qmodel = tiny_quantizable_model("llama")
    warm = make_engine(qmodel, block_size=BS, kv_bits=8, kv_group_size=32)
    turn2, _, reply2, usage2 = two_turns(warm, tokens(20, 11))
    assert warm.stats()["partial_hit_tokens"] == (20 + REPLY - 1) % BS
    cold = make_engine(qmodel, block_size=BS, kv_bits=8, kv_group_size=32)
    assert run(cold, "cold", turn2)[0] == reply2
    warm.check_integrity()


def test_a_running_sequence_lends_its_partial_block(model):
    """The second user arrives while the first still decodes: it copies the first's partial
    last block (live, never cached: the first goes on writing its later slots)."""
    engine = make_engine(model, block_size=BS)
    system = tokens(34, 5)  # the first's prompt ends in its 5th block, 2 tokens after this
    first, second = system + tokens(2, 6), system + tokens(9, 7)
    engine.add_request("first", first, GREEDY)
    outputs, usage = {}, {}
    for step in range(200):
        if step == 3:
            assert engine.cache.partials.is_live(engine.scheduler.running[0].block_ids[-1])
            engine.add_request("second", second, GREEDY)
        for d in engine.step():
            outputs.setdefault(d.request_id, []).extend(d.token_ids)
            usage[d.request_id] = d.usage or usage.get(d.request_id)
        if step > 3 and not engine.has_work():
            break
    assert outputs["first"] == reference_greedy(model, first, REPLY)
    assert outputs["second"] == reference_greedy(model, second, REPLY)
    assert usage["second"].cached_tokens == len(system)
    assert engine.stats()["partial_hit_tokens"] == len(system) % BS
    engine.check_integrity()
