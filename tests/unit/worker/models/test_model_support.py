"""Models are served over the paged KV, each layer paged or gathered, or refused at load in
one sentence; an architecture the tests do not cover passes a greedy check first."""

from __future__ import annotations

import importlib
import logging

import mlx.core as mx
import pytest
from mlx_lm.models import llama
from mlx_lm.models.cache import KVCache

from shared.sampling import SamplingParams
from tests.support.engine_fixtures import _COMMON, make_engine, reference_greedy, tiny_model
from worker.runner.model_support import COVERED_ARCHITECTURES, UnsupportedModel


def tiny(module_name: str, **extra):
    module = importlib.import_module(f"mlx_lm.models.{module_name}")
    fields = module.ModelArgs.__dataclass_fields__
    args = {"model_type": module_name, **_COMMON, "rope_theta": 10000.0, **extra}
    mx.random.seed(0)
    model = module.Model(module.ModelArgs(**{k: v for k, v in args.items() if k in fields}))
    mx.eval(model.parameters())
    return model


class _CustomAttention(llama.Attention):
    """Llama attention, ending in `self.attend` (set per test)."""

    def __call__(self, x, mask=None, cache=None):
        B, L, _ = x.shape
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.reshape(B, L, self.n_heads, -1).transpose(0, 2, 1, 3)
        k = k.reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        v = v.reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        q, k = self.rope(q, offset=cache.offset), self.rope(k, offset=cache.offset)
        k, v = cache.update_and_fetch(k, v)
        out = self.attend(self, q, k, v, cache, mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))


def _with_attention(attend):
    model = tiny_model("llama")
    cls = type("Attention", (_CustomAttention,), {"attend": staticmethod(attend)})
    for layer in model.model.layers:
        layer.self_attn.__class__ = cls
    return model


def _served_like_mlx_lm(model, engine) -> None:
    """Three prompts of different lengths decoded together equal mlx-lm's own greedy."""
    prompts = [[(7 * i + 3 + n) % 90 + 1 for i in range(n)] for n in (5, 23, 41)]
    expected = [reference_greedy(model, p, 5) for p in prompts]
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, SamplingParams(max_tokens=5))
    got: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    while engine.has_work():
        for delta in engine.step():
            got[delta.request_id] += delta.token_ids
    assert [got[f"r{i}"] for i in range(len(prompts))] == expected
    engine.check_integrity()


def test_attention_that_bypasses_the_hook_is_served_gathered():
    """A layer computing attention itself over the K/V its cache returned gets each row's
    gathered K/V and our mask, and matches mlx-lm."""

    def direct(self, q, k, v, cache, mask):
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask=mask)

    model = _with_attention(direct)
    engine = make_engine(model)
    assert engine.runner.layout.gathered == (True, True)
    _served_like_mlx_lm(model, engine)


@pytest.mark.parametrize("gathered", [False, True])
def test_sliding_window_layers_are_served_paged_or_gathered(gathered):
    """Both ways a window layer can read its K/V match mlx-lm (the probe picks paged)."""
    model = tiny("llama", sliding_window=4, layer_types=["sliding_attention", "full_attention"])
    engine = make_engine(model)
    assert [k.window for k in engine.runner.layout.kinds] == [4, None]
    assert engine.runner.layout.gathered == (False, False)
    engine.runner.settle_modes([gathered, False])
    _served_like_mlx_lm(model, engine)


def test_sliding_window_asked_of_the_mask_is_honoured():
    """A model whose caches look plain but whose mask asks for a window: the layer is
    gathered over its whole context and masked to the window."""
    model = tiny("llama", sliding_window=4, layer_types=["sliding_attention", "full_attention"])
    model.make_cache = lambda: [KVCache() for _ in model.layers]
    engine = make_engine(model)
    assert engine.runner.layout.gathered == (True, False)  # a full cache asked for a window
    _served_like_mlx_lm(model, engine)


@pytest.mark.parametrize("gathered", [False, True])
def test_attention_sinks_are_served_paged_or_gathered(gathered):
    from mlx_lm.models import base

    def with_sinks(self, q, k, v, cache, mask):
        sinks = mx.linspace(-1.0, 2.0, self.n_heads)
        return base.scaled_dot_product_attention(
            q, k, v, cache=cache, scale=self.scale, mask=mask, sinks=sinks
        )

    model = _with_attention(with_sinks)
    engine = make_engine(model)
    assert engine.runner.layout.gathered == (False, False)
    engine.runner.settle_modes([gathered, gathered])
    _served_like_mlx_lm(model, engine)


@pytest.mark.parametrize(
    ("cache", "says"),
    [
        ("own", r"'llama' is not served: it uses a cache of its own \(QuantizedKVCache\)"),
        ("list", r"'llama' is not served: it uses a CacheList of two recurrent states or of "),
        ("keep", r"'llama' is not served: it uses a sliding window that keeps its first 4"),
    ],
)
def test_caches_the_paged_kv_cannot_stand_in_for_are_refused_in_one_sentence(cache, says):
    from mlx_lm.models.cache import CacheList, QuantizedKVCache, RotatingKVCache

    model = tiny_model("llama")
    make = {
        "own": lambda: QuantizedKVCache(),
        "list": lambda: CacheList(CacheList(KVCache()), KVCache()),
        "keep": lambda: RotatingKVCache(max_size=8, keep=4),
    }[cache]
    model.make_cache = lambda: [make() for _ in model.layers]
    with pytest.raises(UnsupportedModel, match=says) as refused:
        make_engine(model)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("arch", ["olmo2", "starcoder2"])
def test_untested_architecture_is_served_after_a_greedy_check(arch, caplog):
    assert arch not in COVERED_ARCHITECTURES
    with caplog.at_level(logging.INFO, logger="worker.engine.startup"):
        engine = make_engine(tiny(arch, norm_epsilon=1e-5))
    assert f"model type {arch!r}: paged greedy output matches mlx-lm" in caplog.text
    assert engine.cache.cached_blocks == 0  # the check left nothing behind
    engine.check_integrity()


def test_untested_architecture_whose_greedy_output_differs_is_refused(monkeypatch):
    import worker.engine.startup.checks as startup_module

    monkeypatch.setattr(startup_module, "reference_greedy", lambda m, p, n: [-1] * n)
    with pytest.raises(UnsupportedModel, match=r"'olmo2' is not among the tested.*differs"):
        make_engine(tiny("olmo2"))
