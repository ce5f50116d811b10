"""Models the paged KV would serve wrongly are refused at load, by name; others pass."""

from __future__ import annotations

import importlib
import logging

import mlx.core as mx
import pytest
from mlx_lm.models import llama
from mlx_lm.models.cache import KVCache

from tests.support.engine_fixtures import _COMMON, make_engine, tiny_model
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


def test_attention_that_bypasses_the_hook_is_refused():
    def direct(self, q, k, v, cache, mask):
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask=mask)

    model = _with_attention(direct)
    with pytest.raises(UnsupportedModel, match=r"'llama'.*0 of 2 layers attended.*bypasses"):
        make_engine(model)


def test_sliding_window_cache_is_refused():
    model = tiny("llama", sliding_window=4, layer_types=["sliding_attention", "full_attention"])
    with pytest.raises(UnsupportedModel, match=r"sliding-window.*RotatingKVCache"):
        make_engine(model)


def test_sliding_window_asked_of_the_mask_is_refused():
    """A model whose caches look plain but whose mask asks for a window: caught by the probe."""
    model = tiny("llama", sliding_window=4, layer_types=["sliding_attention", "full_attention"])
    model.make_cache = lambda: [KVCache() for _ in model.layers]
    with pytest.raises(UnsupportedModel, match=r"sliding-window attention \(window \[4\]\)"):
        make_engine(model)


def test_attention_sinks_are_refused():
    from mlx_lm.models import base

    def with_sinks(self, q, k, v, cache, mask):
        sinks = mx.zeros((self.n_heads,))
        return base.scaled_dot_product_attention(
            q, k, v, cache=cache, scale=self.scale, mask=mask, sinks=sinks
        )

    with pytest.raises(UnsupportedModel, match="'llama': attention sinks are not supported"):
        make_engine(_with_attention(with_sinks))


@pytest.mark.parametrize("arch", ["olmo2", "starcoder2"])
def test_untested_architecture_is_served_after_a_greedy_check(arch, caplog):
    assert arch not in COVERED_ARCHITECTURES
    with caplog.at_level(logging.INFO, logger="worker.engine.startup"):
        engine = make_engine(tiny(arch, norm_epsilon=1e-5))
    assert f"model type {arch!r}: paged greedy output matches mlx-lm" in caplog.text
    assert engine.cache.cached_blocks == 0  # the check left nothing behind
    engine.check_integrity()


def test_untested_architecture_whose_greedy_output_differs_is_refused(monkeypatch):
    import worker.engine.startup as startup_module

    monkeypatch.setattr(startup_module, "reference_greedy", lambda m, p, n: [-1] * n)
    with pytest.raises(UnsupportedModel, match=r"'olmo2' is not among the tested.*differs"):
        make_engine(tiny("olmo2"))
