"""Speculative decoding (prompt-lookup drafts verified in the batch): output identical to
plain greedy decoding, limits honoured, drafting backs off where it does not pay."""

from __future__ import annotations

import itertools
import random

import pytest

from shared.sampling import SamplingParams
from tests.support.engine_fixtures import (
    ARCHS,
    make_engine,
    reference_greedy,
    run_to_completion,
    tiny_model,
)
from worker.attention.shared_prefix import gathered_keys
from worker.config import EngineConfig
from worker.engine.scheduler import choose_drafts
from worker.engine.sequence import Sequence, Status
from worker.engine.speculative import (
    COOLDOWN_STEPS,
    DraftState,
    NgramIndex,
    accepted_prefix,
)
from worker.engine.step_kind import REFERENCE_COSTS


def test_ngram_index_proposes_what_followed_the_last_occurrence():
    index = NgramIndex(2)
    tokens = [1, 2, 3, 4, 1, 2]
    index.update(tokens)
    assert index.lookup(tokens, 3) == [3, 4, 1]
    tokens += [9]
    index.update(tokens)
    assert index.lookup(tokens, 3) == []  # (2, 9) never appeared before


def test_accepted_prefix():
    assert accepted_prefix([5, 6, 7], [5, 6, 8, 1]) == 2
    assert accepted_prefix([5, 6, 7], [4, 6, 7, 1]) == 0
    assert accepted_prefix([5, 6, 7], [5, 6, 7, 1]) == 3


def test_low_acceptance_cools_down_then_retries():
    state = DraftState()
    tokens = [1, 2, 3, 1, 2]
    assert state.propose(tokens, 2) == [3, 1]
    for _ in range(6):
        state.record(4, 0)
    assert state.cooldown == COOLDOWN_STEPS and state.propose(tokens, 2) == []
    for _ in range(COOLDOWN_STEPS):
        state.tick()
    assert state.propose(tokens, 2) == [3, 1]


def repetitive(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    motif = [rng.randrange(97) for _ in range(5)]
    return (motif * (length // 5 + 1))[:length]


@pytest.fixture(scope="module", params=list(ARCHS))
def model(request):
    return tiny_model(request.param)


def test_greedy_output_is_identical_with_drafts(model):
    engine = make_engine(model, speculative="ngram", spec_tokens=4)
    prompts = {f"r{i}": repetitive(i, 12 + 7 * i) for i in range(4)}
    prompts["plain"] = [random.Random(9).randrange(97) for _ in range(30)]
    for rid, p in prompts.items():
        engine.add_request(rid, p, SamplingParams(max_tokens=20))
    outputs = run_to_completion(engine)
    for rid, p in prompts.items():
        assert outputs[rid] == reference_greedy(model, p, 20), rid
    stats = engine.stats()
    assert stats["spec_drafted"] > 0  # the verify path ran
    assert stats["spec_accepted"] > 0  # and kept drafts: several tokens in one step
    engine.check_integrity()


def test_stop_tokens_and_max_tokens_inside_accepted_drafts():
    model = tiny_model("llama")
    prompt = repetitive(3, 40)
    plain = make_engine(model)
    plain.add_request("x", prompt, SamplingParams(max_tokens=40))
    expected = run_to_completion(plain)["x"]
    stop = expected[7]  # a token the greedy output reaches
    for params in (
        SamplingParams(max_tokens=40, stop_token_ids=(stop,)),
        SamplingParams(max_tokens=9),
    ):
        ref, spec = make_engine(model), make_engine(model, speculative="ngram")
        for engine in (ref, spec):
            engine.add_request("x", prompt, params)
        assert run_to_completion(spec)["x"] == run_to_completion(ref)["x"]
        spec.check_integrity()


def test_sampled_requests_do_not_draft():
    engine = make_engine(tiny_model("qwen2"), speculative="ngram")
    engine.add_request(
        "s", repetitive(1, 30), SamplingParams(max_tokens=12, temperature=0.9, seed=1)
    )
    run_to_completion(engine)
    assert engine.stats()["spec_drafted"] == 0


def running(tokens: list[int], blocks: list[int], acceptance: float) -> Sequence:
    """A decoding greedy sequence whose whole `tokens` are its prompt, on `blocks`."""
    s = Sequence("r", len(tokens), list(tokens), SamplingParams(max_tokens=32), arrival=0)
    s.status, s.block_ids, s.num_computed = Status.RUNNING, blocks, len(tokens) - 1
    s.drafting = DraftState(acceptance=acceptance)
    return s


def test_drafts_are_chosen_per_row_by_what_they_save():
    """32 rows over 4 tenants' 1000-token prefixes, all proposing drafts: at that batch a
    tick's cost per row buys a draft only where it is usually accepted; alone, a row drafts
    even at even odds. No batch limit."""
    config = EngineConfig(speculative="ngram", spec_tokens=4)
    ids = itertools.count(1)
    tenants = [[next(ids) for _ in range(1000 // 32)] for _ in range(4)]
    batch = []
    for i in range(32):
        tokens = repetitive(i, 1040 + i % 7)
        own = [next(ids) for _ in range(-(-len(tokens) // 32) - len(tenants[0]))]
        batch.append(running(tokens, tenants[i % 4] + own, 0.95 if i % 2 else 0.1))
    chosen = choose_drafts(batch, config, 4096, REFERENCE_COSTS, 32)
    assert {id(s) for s in batch[1::2]} == set(chosen)
    assert all(len(d) == 4 for d in chosen.values())
    alone = running(repetitive(0, 1040), tenants[0] + [next(ids) for _ in range(2)], 0.5)
    assert choose_drafts([alone], config, 4096, REFERENCE_COSTS, 32)
    off = EngineConfig(speculative="off")
    assert not choose_drafts(batch, off, 4096, REFERENCE_COSTS, 32)


def test_mixed_batch_drafts_as_one_token_rows_with_shared_prefixes(model):
    """12 requests (more than the old batch limit) on one 64-token system prompt: greedy ones
    with repetitive questions draft, seeded sampled ones never do. Steps where some rows
    verify drafts and others do not run every token as a one-token row (no padding), the
    system prompt gathered once; the tokens are those of speculative decoding off, and the
    greedy ones mlx-lm's."""
    rng = random.Random(5)
    system = [rng.randrange(97) for _ in range(64)]
    prompts = {f"r{i}": system + repetitive(i, 12 - i % 3) for i in range(12)}
    params = {
        rid: SamplingParams(max_tokens=16, temperature=0.8 * (i % 2), seed=i)
        for i, rid in enumerate(prompts)
    }
    spec, plain = make_engine(model, speculative="ngram"), make_engine(model)
    steps = []
    plan_rows = spec.runner.plan_rows

    def recording(plan, on_device):
        rows, points = plan_rows(plan, on_device)
        drafting = sum(len(r.tokens) > 1 for r in plan.decode)
        if 0 < drafting < len(plan.decode):
            tables = [r.block_ids for r in rows]
            lengths = [r.start + len(r.tokens) for r in rows]
            shared = gathered_keys(tables, lengths, 8) < sum(lengths)
            steps.append((max(len(r.tokens) for r in rows), shared))
        return rows, points

    spec.runner.plan_rows = recording
    for engine in (spec, plain):
        for rid, p in prompts.items():
            engine.add_request(rid, p, params[rid])
    outputs, expected = run_to_completion(spec), run_to_completion(plain)
    assert outputs == expected
    for rid in ("r0", "r2"):
        assert outputs[rid] == reference_greedy(model, prompts[rid], 16), rid
    assert steps and all(width == 1 for width, _ in steps)
    assert any(shared for _, shared in steps)
    assert spec.stats()["spec_accepted"] > 0
    spec.check_integrity()
