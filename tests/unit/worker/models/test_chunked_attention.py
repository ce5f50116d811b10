"""Llama 4's chunked local attention (a query at p sees the keys from ⌊p / C⌋·C to p), served
over the paged KV from a model directory as a worker loads it: greedy output equal to mlx-lm's
with rows at different positions in one batch, after a prefix hit that ends inside a chunk,
and under a pool small enough to preempt. The chunked layers' pages go back once every holder
of a block has its next query in a later chunk, and a hit needs only the pages from its end's
chunk start (`worker.engine.caches.chunks`).

The zoo's llama4 (tests/support/arch_zoo/moe.py) has chunks of 8 and a query temperature that
steps every 8 positions, strong enough to change its greedy tokens: both are per row."""

from __future__ import annotations

import pytest
from mlx_lm import load

from shared.sampling import SamplingParams
from tests.support.arch_zoo.base import CHUNK
from tests.support.arch_zoo.saved import save
from tests.support.engine_fixtures import load_engine, reference_greedy
from worker.runner.layer_groups import CHUNK as CHUNK_KIND
from worker.runner.layer_groups import LayerKind

MAX_TOKENS = 10  # decodes run past a chunk boundary too


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(the llama4 model directory, mlx-lm's own load of it)"""
    path = save("llama4", tmp_path_factory.mktemp("zoo") / "llama4")
    return path, load(str(path))[0]


def _prompt(length: int, salt: int) -> list[int]:
    return [(13 * i + 7 + salt) % 90 + 1 for i in range(length)]


def _run(engine, requests: dict[str, list[int]]):
    """Submit `requests` together and step to the end: tokens, usage, and the most page units
    in use (not spare) at once."""
    for rid, prompt in requests.items():
        engine.add_request(rid, prompt, SamplingParams(max_tokens=MAX_TOKENS))
    tokens: dict[str, list[int]] = {rid: [] for rid in requests}
    usage, peak = {}, 0
    while engine.has_work():
        for delta in engine.step():
            assert delta.error is None, delta.error
            tokens[delta.request_id] += delta.token_ids
            usage[delta.request_id] = delta.usage or usage.get(delta.request_id)
        pages = engine.pool.pages
        peak = max(peak, pages.units_held - pages.spare_units())
    return tokens, usage, peak


def _expected(model, requests: dict[str, list[int]]) -> dict[str, list[int]]:
    return {rid: reference_greedy(model, p, MAX_TOKENS) for rid, p in requests.items()}


def test_chunked_layers_are_read_gathered_from_window_pages(saved):
    engine = load_engine(saved[0])
    chunked = LayerKind(CHUNK_KIND, CHUNK)
    assert engine.runner.layout.kinds == (chunked, chunked, chunked, LayerKind())
    assert engine.runner.layout.gathered == (True, True, True, False)  # the full one: paged
    assert engine.pool.pages is not None and engine.pool.pages.groups == 3
    assert "chunked local attention 8" in {g.kind for g in engine.attention_report.kv_groups}


def test_rows_at_different_positions_across_chunks_equal_mlx_lm(saved):
    """Five prompts from inside the first chunk to past the fifth, prefilled in 12-token
    pieces that cut through chunks and blocks, then decoded together."""
    path, model = saved
    engine = load_engine(path, prefill_chunk=12, step_token_budget=40)
    requests = {f"p{n}": _prompt(n, n) for n in (3, 9, 17, 30, 45)}
    tokens, _, _ = _run(engine, requests)
    assert tokens == _expected(model, requests)
    engine.check_integrity()


def test_a_prefix_hit_ending_inside_a_chunk_equals_mlx_lm(saved):
    """Blocks of 4 tokens: a hit of 36 tokens ends halfway through the chunk [32, 40), whose
    first keys come from the cache; a second request rides along at another position."""
    path, model = saved
    engine = load_engine(path, block_size=4, prefill_chunk=16, step_token_budget=48)
    first = _prompt(38, 1)
    tokens, _, _ = _run(engine, {"first": first})
    follow = first[:36] + _prompt(11, 2)
    requests = {"follow": follow, "other": _prompt(21, 3)}
    tokens, usage, _ = _run(engine, requests)
    assert tokens == _expected(model, requests)
    assert usage["follow"].cached_tokens == 36
    engine.check_integrity()


def test_a_hit_needs_only_the_pages_of_its_own_chunk(saved):
    """Blocks of 4 (chunks of 2 blocks), every page of a 40-token prompt taken back: a hit
    ending at a chunk start (32) needs none and is whole; one ending inside the next chunk
    (36) would read block 8's, so it is cut to 32. The window rule of C would need the pages
    of the 2 blocks before either end: no hit at all."""
    path, model = saved
    engine = load_engine(path, block_size=4, prefill_chunk=16, step_token_budget=48)
    first = _prompt(40, 1)
    _run(engine, {"first": first})
    engine.pool.pages.make_free(engine.pool.num_blocks)  # every spare page taken back
    assert engine.pool.pages.units_held == engine.pool.pages.kept_units([engine.scratch_block])
    requests = {"at_start": first[:32] + _prompt(7, 2), "inside": first[:36] + _prompt(5, 3)}
    tokens, usage, _ = _run(engine, requests)
    assert tokens == _expected(model, requests)
    assert usage["at_start"].cached_tokens == usage["inside"].cached_tokens == 32
    engine.check_integrity()


def test_preempted_and_resumed_sequences_equal_mlx_lm(saved):
    """A pool of 22 units (a block takes 4: its own and a page per chunked sub-group, which
    goes back at the next chunk) cannot hold five growing sequences at once: some are
    preempted, resumed, and still exact."""
    path, model = saved
    engine = load_engine(path, num_blocks=22, max_running=6, prefill_chunk=8)
    requests = {f"p{i}": _prompt(17 + 6 * i, i) for i in range(5)}
    tokens, _, _ = _run(engine, requests)
    assert tokens == _expected(model, requests)
    assert engine.stats()["preemptions"] > 0
    engine.check_integrity()


def test_chunked_pages_are_released_once_every_holder_is_past_them(saved):
    """Two requests share a 48-token prefix and run together: the prefix blocks' pages stay
    while either still reads them and go spare once both are past; the pages in use never
    cover every block held."""
    path, model = saved
    engine = load_engine(path, prefill_chunk=16, step_token_budget=64)
    prefix = _prompt(48, 4)
    requests = {"a": prefix + _prompt(20, 5), "b": prefix + _prompt(9, 6)}
    tokens, _, peak = _run(engine, requests)
    assert tokens == _expected(model, requests)
    pages = engine.pool.pages
    blocks = sum(engine.pool.blocks_for_tokens(len(p) + MAX_TOKENS) for p in requests.values())
    assert pages.released >= 6  # the prefix's first blocks, once both were past them
    assert peak < blocks * pages.groups
    engine.check_integrity()
