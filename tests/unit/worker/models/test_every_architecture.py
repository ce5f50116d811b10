"""Every architecture the installed mlx-lm builds (tiny random weights, `tests.support.arch_zoo`),
except the hybrid recurrent ones (test_hybrid_state.py), saved as a model directory and loaded
as a worker loads it (`Engine.from_path`), is served over the paged KV with greedy output equal
to mlx-lm's own `generate_step` on mlx-lm's load of that directory, or refused at load in one
sentence.

One engine per architecture covers: prompts of different lengths decoded together, each
longer than the zoo's 8-token sliding windows; chunked prefill (16-token chunks); a radix
prefix hit (a prompt extending a finished one: its cached tokens counted); two choices
forked from one prefill (n = 2). A few families also run preempted and resumed under a
pool too small for their batch (DeepSeek V3.2 and LongCat-Flash among them: two caches per
layer, an indexer's keys beside MLA's or two attention blocks, each its own slot of the pool).
"""

from __future__ import annotations

import pytest
from mlx_lm import load

from shared.sampling import SamplingParams
from tests.support.arch_zoo import ARCHITECTURES, RECURRENT, runs_here
from tests.support.arch_zoo.saved import save
from tests.support.engine_fixtures import load_engine, reference_greedy
from worker.runner.model_support import UnsupportedModel

# refused at load, and the one sentence that says why
REFUSED = {
    "deepseek_v41": r"a cache of its own \(LayerCache\)",
    "gpt_bigcode": "position embeddings indexed by one number for the whole batch",
    "afm7": "positions from the K/V length",
    "plamo3": "asks a window of 9 of a layer whose cache keeps 8 keys",
}
CANDIDATES = sorted(a for a in ARCHITECTURES if a not in RECURRENT and runs_here(a))
SERVED = [a for a in CANDIDATES if a not in REFUSED]
MAX_TOKENS = 5


def _loaded(arch: str, directory, **overrides):
    """(the engine a worker would open on `arch` saved to `directory`, mlx-lm's own model)"""
    path = save(arch, directory / arch)
    return load_engine(path, **overrides), load(str(path))[0]


def _prompt(length: int, salt: int) -> list[int]:
    return [(7 * i + 3 + salt) % 90 + 1 for i in range(length)]


def _run(engine, requests: dict[str, tuple[list[int], int]], max_tokens: int = MAX_TOKENS):
    """Submit `requests` (id -> (prompt, n)) together; each choice's tokens, and usage."""
    for rid, (prompt, n) in requests.items():
        engine.add_request(rid, prompt, SamplingParams(max_tokens=max_tokens), n=n)
    tokens: dict[tuple[str, int], list[int]] = {}
    usage = {}
    while engine.has_work():
        for delta in engine.step():
            assert delta.error is None, delta.error
            tokens.setdefault((delta.request_id, delta.index), []).extend(delta.token_ids)
            if delta.usage is not None:
                usage[delta.request_id] = delta.usage
    return tokens, usage


@pytest.mark.parametrize("arch", SERVED)
def test_served_with_greedy_output_equal_to_mlx_lm(arch, tmp_path):
    engine, model = _loaded(arch, tmp_path, prefill_chunk=16, step_token_budget=48)
    prompts = {"a": _prompt(5, 0), "b": _prompt(23, 1), "c": _prompt(41, 2)}
    expected = {rid: reference_greedy(model, p, MAX_TOKENS) for rid, p in prompts.items()}
    tokens, _ = _run(engine, {rid: (p, 1) for rid, p in prompts.items()})
    assert {rid: tokens[(rid, 0)] for rid in prompts} == expected

    # a prompt extending "c" hits its cached blocks; forked into two choices
    longer = prompts["c"] + _prompt(11, 3)
    want = reference_greedy(model, longer, MAX_TOKENS)
    tokens, usage = _run(engine, {"d": (longer, 2)})
    assert tokens[("d", 0)] == tokens[("d", 1)] == want
    assert usage["d"].cached_tokens >= 32
    engine.check_integrity()


@pytest.mark.parametrize("arch", sorted(REFUSED))
def test_refused_at_load_in_one_sentence(arch, tmp_path):
    with pytest.raises(UnsupportedModel, match=REFUSED[arch]) as refused:
        load_engine(save(arch, tmp_path / arch))
    assert "\n" not in str(refused.value)
    assert f"{arch!r}" in str(refused.value) or "model type" in str(refused.value)


def test_the_sweep_covers_every_runnable_architecture():
    """Nothing is left out silently: every built, runnable, non-recurrent architecture is
    served or refused above, and those refused are few."""
    assert set(SERVED) | set(REFUSED) == set(CANDIDATES)
    assert len(SERVED) >= 90


@pytest.mark.parametrize(
    "arch",
    ["gpt_oss", "gemma3_text", "deepseek_v3", "gemma2", "gemma3n", "deepseek_v32", "longcat_flash"],
)
def test_preempted_and_resumed_sequences_match_mlx_lm(arch, tmp_path):
    # 12 blocks; models with window pages take a unit per block and per page: 14 units
    units = {"gpt_oss": 14, "gemma3_text": 14, "gemma3n": 14}.get(arch, 12)
    engine, model = _loaded(arch, tmp_path, num_blocks=units, max_running=6, prefill_chunk=16)
    prompts = {f"p{i}": _prompt(17 + 6 * i, i) for i in range(5)}
    expected = {rid: reference_greedy(model, p, MAX_TOKENS) for rid, p in prompts.items()}
    tokens, _ = _run(engine, {rid: (p, 1) for rid, p in prompts.items()})
    assert {rid: tokens[(rid, 0)] for rid in prompts} == expected
    assert engine.stats()["preemptions"] > 0
    engine.check_integrity()


def test_minimax_m3_sparse_layers_are_refused_in_one_sentence():
    """MiniMax-M3's indexer places every row's queries at the end of the batch's keys: served
    without sparse layers (the zoo's config, above), refused at load with them."""
    import copy

    from tests.support.arch_zoo import module_for
    from tests.support.engine_fixtures import make_engine

    config = copy.deepcopy(ARCHITECTURES["minimax_m3_vl"])
    config["text_config"].update(
        index_n_heads=2, index_head_dim=16, index_block_size=4, index_topk_blocks=2
    )
    module = module_for(config)
    model = module.Model(module.ModelArgs.from_dict(config))
    with pytest.raises(UnsupportedModel, match="queries at the end of the batch's keys"):
        make_engine(model)
