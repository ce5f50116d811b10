"""A worker's inventory: every block it holds, in parts, as its KV events describe them."""

from __future__ import annotations

import pytest

from router.routing.prefix_index import PrefixIndex
from shared.hashing import hash_blocks
from shared.sampling import SamplingParams
from tests.support.arch_zoo import build
from tests.support.engine_fixtures import make_engine, tiny_model
from worker.inventory import held_blocks, inventory, inventory_parts


def prompt(length: int, salt: int) -> list[int]:
    return [(11 * i + 5 + salt) % 90 + 1 for i in range(length)]


def serve(engine, prompts: dict[str, list[int]]) -> None:
    for rid, tokens in prompts.items():
        engine.add_request(rid, tokens, SamplingParams(max_tokens=4))
    while engine.has_work():
        engine.step()


def follow(index: PrefixIndex, worker: str, events) -> None:
    for event in events:
        index.apply(worker, event)


def from_inventory(engine, worker: str, window: int = 0) -> PrefixIndex:
    index = PrefixIndex()
    index.set_window(worker, window)
    index.set_snapshots(worker, engine.states is not None)
    for part in inventory(engine, worker):
        index.receive_inventory(
            worker, part.part, part.parts, part.block_hashes, part.windowless, part.snapshots
        )
    return index


def test_the_inventory_holds_what_the_events_announced():
    engine = make_engine(tiny_model("llama", seed=3), num_blocks=24)
    by_events = PrefixIndex()
    prompts = {f"r{i}": prompt(20 + 13 * i, i) for i in range(6)}
    for rid, tokens in prompts.items():  # 24 blocks of 8: later prompts evict earlier ones
        serve(engine, {rid: tokens})
        follow(by_events, "w", engine.drain_kv_events())
    blocks, windowless, snapshots = held_blocks(engine)
    assert snapshots == []
    assert len(blocks) == len(set(blocks)) == engine.cache.cached_blocks > 0
    assert windowless == set()
    by_inventory = from_inventory(engine, "w")
    assert by_inventory.num_blocks("w") == by_events.num_blocks("w") == len(blocks)
    for tokens in prompts.values():
        chain = hash_blocks(tokens, 8)
        assert by_inventory.match(chain, ["w"]) == by_events.match(chain, ["w"])
    assert engine.cache.evicted_blocks > 0  # some of them were gone: both agree on which


@pytest.mark.parametrize("arch", ["gemma3_text"])
def test_the_inventory_says_which_blocks_lost_their_window_pages(arch):
    model = build(arch)  # windows of 8 tokens, blocks of 8
    engine = make_engine(model, prefill_chunk=16, step_token_budget=48)
    window = engine.pool.pages.blocks_before_match
    by_events = PrefixIndex()
    by_events.set_window("w", window)
    first = prompt(70, 4)
    serve(engine, {"first": first, "other": prompt(40, 7)})
    engine.pool.pages.make_free(engine.pool.num_blocks)  # every spare page taken back
    follow(by_events, "w", engine.drain_kv_events())
    _, windowless, _ = held_blocks(engine)
    assert windowless  # some cached blocks lost their pages
    by_inventory = from_inventory(engine, "w", window)
    for tokens in (first, first[:40] + prompt(20, 6), prompt(40, 7)):
        chain = hash_blocks(tokens, 8)
        assert by_inventory.match(chain, ["w"]) == by_events.match(chain, ["w"])
    assert by_inventory.match(hash_blocks(first[:40], 8), ["w"]) == {"w": 0}


def test_the_inventory_says_where_a_hybrid_model_keeps_state_snapshots():
    engine = make_engine(build("qwen3_next"), prefill_chunk=64)
    by_events = PrefixIndex()
    by_events.set_snapshots("w", True)
    system = prompt(24, 7)  # three blocks: the second prompt snapshots at its end
    prompts = [system + prompt(13, salt) for salt in (1, 2)] + [prompt(30, 9)]
    for i, tokens in enumerate(prompts):
        serve(engine, {f"r{i}": tokens})
    follow(by_events, "w", engine.drain_kv_events())
    held = held_blocks(engine)
    assert set(held.snapshots) == set(engine.states.pool.snapshots) != set()
    by_inventory = from_inventory(engine, "w")
    for tokens in [*prompts, system + prompt(13, 3)]:
        chain = hash_blocks(tokens, 8)
        assert by_inventory.match(chain, ["w"]) == by_events.match(chain, ["w"])
    assert by_inventory.match(hash_blocks(system + prompt(13, 3), 8), ["w"]) == {"w": 3}


def test_a_big_inventory_comes_in_parts():
    blocks = list(range(1, 40_001))
    parts = inventory_parts("w", blocks, {5, 20_000, 39_999}, [7, 8], per_part=16_384)
    assert [(p.part, p.parts, len(p.block_hashes)) for p in parts] == [
        (0, 3, 16_384),
        (1, 3, 16_384),
        (2, 3, 7_232),
    ]
    assert [p.windowless for p in parts] == [(5,), (20_000,), (39_999,)]
    assert [p.snapshots for p in parts] == [(7, 8), (), ()]
    assert [h for p in parts for h in p.block_hashes] == blocks
    (empty,) = inventory_parts("w", [], set())
    assert (empty.part, empty.parts, empty.block_hashes) == (0, 1, ())
