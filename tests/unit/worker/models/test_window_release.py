"""Sliding-window layers give their pages back once out of every window, keep them for hits
until another block needs one, and a hit uses only what is still there: greedy output stays
equal to mlx-lm's throughout (`worker.kv.window_pages`)."""

from __future__ import annotations

import pytest

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
            peak = max(peak, engine.pool.pages.in_use())
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
    assert peak < engine.pool.blocks_for_tokens(70 + 12 + 2 * MAX_TOKENS)
    engine.check_integrity()


def test_a_small_page_pool_takes_spare_pages_back_and_stays_exact(model):
    """Ten pages for two 70-token prompts (20 blocks): spare pages are taken back for new
    blocks, and every token still equals mlx-lm's."""
    engine = make_engine(model, window_pages=10, prefill_chunk=16, step_token_budget=48)
    prompts = {"a": _prompt(70, 2), "b": _prompt(66, 3)}
    tokens, _, peak = _run(engine, prompts)
    assert tokens == {rid: reference_greedy(model, p, MAX_TOKENS) for rid, p in prompts.items()}
    assert engine.pool.pages.reclaimed > 0
    assert peak <= 10
    engine.check_integrity()


def test_a_hit_uses_only_the_blocks_whose_window_pages_remain(model):
    """A follow-up extending a finished conversation hits all of it (its last blocks kept their
    pages); a prompt sharing only an early prefix, whose pages were taken back, hits less or
    nothing, and both answer exactly as mlx-lm."""
    engine = make_engine(model, window_pages=8, prefill_chunk=16, step_token_budget=48)
    first = _prompt(70, 4)
    tokens, _, _ = _run(engine, {"first": first})
    follow = first + tokens["first"] + _prompt(9, 5)
    early = first[:40] + _prompt(20, 6)
    tokens, usage, _ = _run(engine, {"follow": follow})
    assert tokens["follow"] == reference_greedy(model, follow, MAX_TOKENS)
    assert usage["follow"].cached_tokens >= 64
    tokens, usage, _ = _run(engine, {"early": early})
    assert tokens["early"] == reference_greedy(model, early, MAX_TOKENS)
    assert usage["early"].cached_tokens < 40  # the radix tree holds 40, the windows fewer
    engine.check_integrity()


def test_release_off_keeps_window_layers_in_blocks(model):
    engine = make_engine(model, release_windows=False)
    assert engine.pool.pages is None
    prompts = {"a": _prompt(40, 7)}
    tokens, _, _ = _run(engine, prompts)
    assert tokens["a"] == reference_greedy(model, prompts["a"], MAX_TOKENS)


def test_usable_blocks_needs_the_pages_just_before_the_match_point():
    pages = WindowPages(num_pages=4, num_blocks=8, window=17, block_size=8)  # 2 blocks back
    assert pages.blocks_before_match == 2
    for block in (0, 1, 2, 3):
        pages.give(block)
    assert pages.usable_blocks([0, 1, 2, 3]) == 4
    pages.take_back(2)
    assert pages.usable_blocks([0, 1, 2, 3]) == 2  # blocks 0, 1 still paged
    pages.take_back(1)
    assert pages.usable_blocks([0, 1, 2, 3]) == 1  # block 0 alone before the first
    pages.take_back(0)
    assert pages.usable_blocks([0, 1, 2, 3]) == 0


def test_spare_pages_are_taken_back_least_recently_spared_first():
    pages = WindowPages(num_pages=2, num_blocks=4, window=8, block_size=8)
    pages.give(0)
    pages.give(1)
    assert pages.available() == 0
    pages.spare(1)
    pages.spare(0)
    assert pages.available() == 2
    pages.give(2)  # takes block 1's page: spared first
    assert not pages.has_page(1) and pages.has_page(0) and pages.reclaimed == 1
    pages.unspare(0)
    assert pages.available() == 0
