"""Sliding-window layers give their pages back once out of every window, keep them for hits
until another block needs one, and a hit uses only what is still there: greedy output stays
equal to mlx-lm's throughout (`worker.kv.window_pages`)."""

from __future__ import annotations

import pytest

from shared.kv_events import BlockWindowsDropped
from shared.sampling import SamplingParams
from tests.support.arch_zoo import build
from tests.support.engine_fixtures import make_engine, reference_greedy
from worker.kv.window_pages import WindowPages

MAX_TOKENS = 6


def _prompt(length: int, salt: int) -> list[int]:
    return [(11 * i + 5 + salt) % 90 + 1 for i in range(length)]


def _run(engine, requests: dict[str, list[int]]):
    for rid, prompt in requests.items():
        engine.add_request(rid, prompt, SamplingParams(max_tokens=MAX_TOKENS))
    tokens: dict[str, list[int]] = {rid: [] for rid in requests}
    usage = {}
    peak = 0
    while engine.has_work():
        for delta in engine.step():
            assert delta.error is None, delta.error
            tokens[delta.request_id] += delta.token_ids
            usage[delta.request_id] = delta.usage or usage.get(delta.request_id)
        if engine.pool.pages is not None:
            peak = max(peak, engine.pool.pages.units_held - engine.pool.pages.spare_units())
    return tokens, usage, peak


@pytest.fixture(scope="module", params=["gemma3_text", "gpt_oss"])
def model(request):
    return build(request.param)  # windows of 8 tokens, blocks of 8 (make_engine)


def test_out_of_window_pages_are_released_while_running(model):
    engine = make_engine(model)
    prompts = {"long": _prompt(70, 0), "short": _prompt(12, 1)}
    tokens, _, peak = _run(engine, prompts)
    assert tokens == {rid: reference_greedy(model, p, MAX_TOKENS) for rid, p in prompts.items()}
    pages = engine.pool.pages
    assert pages is not None
    # the 70-token prompt's 10 blocks: all but the last few gave their window pages up
    assert pages.released >= 6
    blocks = engine.pool.blocks_for_tokens(70 + MAX_TOKENS) + engine.pool.blocks_for_tokens(12)
    assert peak < blocks * pages.groups  # pages in use never held every block's
    engine.check_integrity()


def test_a_small_pool_takes_spare_pages_back_and_stays_exact(model):
    """Two 70-token prompts need 20 blocks, and as many pages again, of a 34-unit pool: spare
    pages are taken back for new blocks, and every token still equals mlx-lm's."""
    engine = make_engine(model, num_blocks=34, prefill_chunk=16, step_token_budget=48)
    prompts = {"a": _prompt(70, 2), "b": _prompt(66, 3)}
    tokens, _, _ = _run(engine, prompts)
    assert tokens == {rid: reference_greedy(model, p, MAX_TOKENS) for rid, p in prompts.items()}
    assert engine.pool.pages.reclaimed > 0
    assert engine.stats()["preemptions"] == 0  # the pages went, not a sequence
    engine.check_integrity()


def test_a_hit_uses_only_the_blocks_whose_window_pages_remain(model):
    """A follow-up extending a finished conversation hits all of it (its last blocks kept
    their pages). Once memory pressure takes every spare page back, a prompt sharing 40
    tokens the radix tree still holds hits none of them (no window pages before its match
    point), and both answer exactly as mlx-lm."""
    engine = make_engine(model, prefill_chunk=16, step_token_budget=48)
    first = _prompt(70, 4)
    tokens, _, _ = _run(engine, {"first": first})
    follow = first + tokens["first"] + _prompt(9, 5)
    tokens, usage, _ = _run(engine, {"follow": follow})
    assert tokens["follow"] == reference_greedy(model, follow, MAX_TOKENS)
    assert usage["follow"].cached_tokens >= 72
    pages = engine.pool.pages
    engine.drain_kv_events()
    pages.make_free(engine.pool.num_blocks)  # as a burst of new blocks would
    assert pages.reclaimed > 0
    # the router hears which cached blocks lost their windows, and counts hits as we do
    dropped = [e for e in engine.drain_kv_events() if isinstance(e, BlockWindowsDropped)]
    assert dropped and 0 < len(dropped[0].block_hashes) <= pages.reclaimed  # (tails: no hash)
    early = first[:40] + _prompt(20, 6)
    assert engine.cache.peek_prefix_length(early) == 40
    tokens, usage, _ = _run(engine, {"early": early})
    assert tokens["early"] == reference_greedy(model, early, MAX_TOKENS)
    assert usage["early"].cached_tokens == 0
    engine.check_integrity()


def _four_together(engine, model, system: list[int]):
    """Four 142-token prompts run together, the first `len(system)` tokens of each `system`;
    the peak of live page units (held, not spare), outputs checked against mlx-lm."""
    prompts = {f"s{i}": system + _prompt(142 - len(system), 20 + i) for i in range(4)}
    tokens, _, peak = _run(engine, prompts)
    assert tokens == {rid: reference_greedy(model, p, MAX_TOKENS) for rid, p in prompts.items()}
    engine.check_integrity()
    return peak


def test_a_shared_system_prompt_releases_its_pages_once_every_holder_is_past_it(model):
    """The shared system prompt's blocks, and each sequence's own blocks after them, release
    their pages as the unshared case does: live pages within 1.2x of it (they were 2.9x on
    gemma3_text, 38 units vs 13, while a block others held stopped every release)."""
    alone = _four_together(make_engine(model), model, [])
    engine = make_engine(model)
    shared = _four_together(engine, model, _prompt(64, 30))
    assert shared <= 1.2 * alone
    # every sequence's own blocks after the system prompt were released too
    assert engine.pool.pages.released >= 4 * 6 + 64 // engine.block_size


def test_forked_choices_keep_what_their_parent_released(model):
    """n = 3 choices forked from one 70-token prefill, 20 tokens each: the blocks the prefill
    released stay released (each choice is past them), and the prompt's later blocks, held
    by all three, are released once all three are past them; each choice answers as mlx-lm
    does. (A fork used to start past nothing, which held every shared block's pages: 15 live
    units at the peak and 6 blocks released, against 10 and 11.)"""
    engine = make_engine(model)
    prompt = _prompt(70, 40)
    engine.add_request("n3", prompt, SamplingParams(max_tokens=20), n=3)
    pages, choices, peak = engine.pool.pages, {}, 0
    while engine.has_work():
        for delta in engine.step():
            assert delta.error is None, delta.error
            choices.setdefault(delta.index, []).extend(delta.token_ids)
        peak = max(peak, pages.units_held - pages.spare_units())
    assert list(choices.values()) == [reference_greedy(model, prompt, 20)] * 3
    assert peak <= 10 * pages.groups
    assert pages.released >= 11
    engine.check_integrity()


def test_release_off_keeps_window_layers_in_blocks(model):
    engine = make_engine(model, release_windows=False)
    assert engine.pool.pages is None
    prompts = {"a": _prompt(40, 7)}
    tokens, _, _ = _run(engine, prompts)
    assert tokens["a"] == reference_greedy(model, prompts["a"], MAX_TOKENS)


def _pages(units: int, groups: int = 1, window: int = 17):
    from collections import deque

    free = deque(range(units))
    return WindowPages(groups, free, units, window, block_size=8), free


def test_usable_blocks_needs_the_pages_just_before_the_match_point():
    pages, free = _pages(8)  # window 17: the 2 blocks before a match point
    assert pages.blocks_before_match == 2
    for block in [free.popleft() for _ in range(4)]:
        pages.give(block)  # blocks 0-3, their pages units 4-7
    assert pages.usable_blocks([0, 1, 2, 3]) == 4
    pages.take_back(2)
    assert pages.usable_blocks([0, 1, 2, 3]) == 2  # blocks 0, 1 still paged
    pages.take_back(1)
    assert pages.usable_blocks([0, 1, 2, 3]) == 1  # block 0 alone before the first
    pages.take_back(0)
    assert pages.usable_blocks([0, 1, 2, 3]) == 0


def test_a_shared_block_is_spare_once_every_holder_is_past_it():
    pages, free = _pages(12)
    blocks = [free.popleft() for _ in range(4)]
    for block in blocks:
        pages.give(block)
    refs = {0: 2, 1: 2, 2: 1, 3: 1}.get  # blocks 0, 1 shared by sequences a and b
    assert pages.release(blocks, 0, 3, refs) == 3  # a is past blocks 0-2
    assert pages.spare_units() == 1  # block 2 (a's own); 0 and 1 wait for b
    assert pages.release(blocks[:2], 0, 1, refs) == 1  # b is past block 0
    assert pages.spare_units() == 2
    # b finishes: it lets go of block 0 (past it) and block 1 (not past it), after which a,
    # past both, holds them alone
    pages.leave(blocks[:2], 1, {0: 1, 1: 1}.get)
    assert pages.spare_units() == 3 and pages.past[:3] == [1, 1, 1]
    pages.join(blocks[:2])  # a fork of a: past what a is past
    assert pages.past[:2] == [2, 2]


def test_spare_pages_are_taken_back_least_recently_spared_first():
    pages, free = _pages(6, groups=2)  # a block and its two pages take 3 units
    for block in [free.popleft(), free.popleft()]:
        pages.give(block)  # blocks 0, 1 get pages 2, 3 and 4, 5
    assert not free and pages.spare_units() == 0
    pages.spare(1)
    pages.spare(0)
    assert pages.spare_units() == 4
    pages.make_free(2)  # block 1 was spared first: its pages go
    assert not pages.has_page(1) and pages.has_page(0) and pages.reclaimed == 1
    assert sorted(free) == [4, 5]
    pages.unspare(0)
    pages.make_free(4)  # nothing spare is left to take
    assert pages.has_page(0) and len(free) == 2


def test_window_layers_in_several_page_sub_groups_stay_on_the_paged_plan():
    """Gemma 3's 5:1 pattern puts its window layers in several page sub-groups (one table
    each); the model makes one window mask for all of them, so the probe must still keep
    them paged (a mask per sub-group made them all gathered: twice the decode tick)."""
    import importlib

    import mlx.core as mx

    from tests.support.arch_zoo import ARCHITECTURES

    config = {**ARCHITECTURES["gemma3_text"], "num_hidden_layers": 6, "sliding_window_pattern": 3}
    module = importlib.import_module("mlx_lm.models.gemma3_text")
    mx.random.seed(1)
    model = module.Model(module.ModelArgs.from_dict(config))
    mx.eval(model.parameters())
    engine = make_engine(model)
    assert engine.pool.pages is not None and engine.pool.pages.groups == 2
    assert engine.runner.layout.gathered == (False,) * 6
    prompts = {"a": _prompt(45, 8), "b": _prompt(19, 9)}
    tokens, _, _ = _run(engine, prompts)
    assert tokens == {rid: reference_greedy(model, p, MAX_TOKENS) for rid, p in prompts.items()}
    engine.check_integrity()
