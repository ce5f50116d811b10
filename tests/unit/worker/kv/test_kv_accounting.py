"""Every KV block accounted for in what the worker reports: free + held + cached full blocks +
cached partial tails == total, and an idle worker holds none (issue 35: partial tails were not
reported, so an idle worker seemed to hold blocks that were neither free nor cached)."""

from __future__ import annotations

from router.metrics.kv_blocks import KVBlocks
from shared.protocol import Heartbeat, decode, encode
from shared.sampling import SamplingParams
from tests.support.engine_fixtures import make_engine, run_to_completion, tiny_model

BLOCK = 8  # make_engine's block size


def heartbeat(engine) -> Heartbeat:
    """The load as the worker loop sends it, through the wire codec."""
    sent = Heartbeat(worker_id="w", **engine.load()._asdict())
    return decode(encode(sent))


def held_beyond_the_cache(engine) -> int:
    """Counted on the pool: blocks some sequence holds that neither the tree nor the tails
    keep, the scratch block left out."""
    pool, cache = engine.pool, engine.cache
    kept = {b for b in range(pool.num_blocks) if pool.is_cached(b)}
    held = {b for b in range(pool.num_blocks) if pool.ref_count(b) > 0}
    assert {b for b in kept if b in cache.partials} | set(cache._node_of_block) == kept
    return len(held - kept - {engine.scratch_block})


def test_an_idle_worker_accounts_for_every_block():
    engine = make_engine(tiny_model("llama"))
    prompts = {"a": [5] * 21, "b": [5] * 16 + [7] * 3, "c": [9] * 13}  # each ends mid-block
    for request_id, prompt in prompts.items():
        engine.add_request(request_id, prompt, SamplingParams(max_tokens=4))
    run_to_completion(engine)
    engine.check_integrity()

    blocks = KVBlocks.of(heartbeat(engine))
    assert blocks.cached_partial > 0  # the tails the report used to leave out
    assert blocks.cached_partial == len(engine.cache.partials)
    assert blocks.cached_full == engine.cache.cached_blocks > 0
    assert blocks.free + blocks.cached_full + blocks.cached_partial == blocks.total
    assert blocks.held == 0 == held_beyond_the_cache(engine)
    assert blocks.total == engine.kv_capacity_blocks
    usage = engine.pool.usage()
    assert usage.held == 1  # the scratch block, and nothing else
    assert usage.free == blocks.free and usage.cached_only == blocks.total - blocks.free


def test_a_busy_worker_reports_the_blocks_its_requests_hold():
    engine = make_engine(tiny_model("llama"))
    engine.add_request("warm", [3] * 19, SamplingParams(max_tokens=2))
    run_to_completion(engine)
    engine.add_request("long", [3] * 16 + [4] * 30, SamplingParams(max_tokens=40))
    for _ in range(6):
        engine.step()
    assert engine.has_work()

    blocks = KVBlocks.of(heartbeat(engine))
    assert blocks.held == held_beyond_the_cache(engine) > 0
    assert sum((blocks.free, blocks.held, blocks.cached_full, blocks.cached_partial)) == (
        blocks.total
    )
    run_to_completion(engine)
    assert KVBlocks.of(heartbeat(engine)).held == 0


def test_an_idle_window_worker_shows_nothing_held():
    """Gemma 3's window layers keep pages beside each block: the free figure counted blocks
    (units / cost) while the total counted units, so an idle worker seemed to hold most of its
    pool. Both are units now, spare pages counted as free (they are taken back first)."""
    from tests.support.arch_zoo import build

    engine = make_engine(build("gemma3_text"), prefill_chunk=16, step_token_budget=48)
    assert engine.pool.unit_cost > 1
    for request_id, salt in (("a", 1), ("b", 2)):
        prompt = [(7 * i + salt) % 90 + 2 for i in range(70)]
        engine.add_request(request_id, prompt, SamplingParams(max_tokens=4))
    run_to_completion(engine)
    engine.check_integrity()
    blocks = KVBlocks.of(heartbeat(engine))
    assert blocks.held == 0
    assert blocks.free + blocks.cached_full + blocks.cached_partial == blocks.total
    assert blocks.cached_full == engine.cache.cached_blocks > 0
