"""The forward context (`worker.attention.forward`): None outside our forwards, so mlx-lm's
own generation keeps mlx-lm's behaviour; restored on every exit; each thread sees its own."""

from __future__ import annotations

import threading

import mlx.core as mx
import mlx.nn as nn
import pytest

from worker.attention import ForwardContext, building, current_forward
from worker.attention.hook import _paged_sdpa
from worker.vision.deepstack import DeepstackMLP


def _context(batch: int = 2) -> ForwardContext:
    return ForwardContext(mx.zeros((batch,), dtype=mx.int32))


def test_the_context_is_none_outside_a_forward_and_restored_after_nesting():
    assert current_forward() is None
    outer, inner = _context(), _context()
    with building(outer) as entered:
        assert entered is outer and current_forward() is outer
        with building(inner):
            assert current_forward() is inner
        assert current_forward() is outer
    assert current_forward() is None


def test_an_exception_while_building_restores_the_context_before():
    outer = _context()
    with building(outer):
        with pytest.raises(RuntimeError), building(_context()):
            raise RuntimeError("a forward that fails while its graph is built")
        assert current_forward() is outer
    with pytest.raises(ValueError), building(outer):
        raise ValueError
    assert current_forward() is None


def test_another_thread_does_not_see_this_threads_forward():
    seen = []
    with building(_context()):
        thread = threading.Thread(target=lambda: seen.append(current_forward()))
        thread.start()
        thread.join()
    assert seen == [None]


def test_the_hooks_do_what_mlx_lm_does_outside_a_forward():
    mlp = DeepstackMLP(nn.Identity(), index=0)
    x = mx.ones((1, 3, 4))
    add = mx.full((1, 3, 4), 2.0)
    assert mx.array_equal(mlp(x), x).item()  # no context: the MLP alone
    with building(ForwardContext(mx.zeros((1,), dtype=mx.int32), deepstack_adds=[add])):
        assert mx.array_equal(mlp(x), x + add).item()
    assert mx.array_equal(mlp(x), x).item()
    q = mx.random.normal((1, 2, 3, 4), key=mx.random.key(0))
    with building(context := _context(1)):  # attention with no cache of ours: counted
        _paged_sdpa(q, q, q, cache=None, scale=0.5, mask=None)
        _paged_sdpa(q, q, q, cache=None, scale=0.5, mask=None)
    assert context.uncached_attention == 2
    _paged_sdpa(q, q, q, cache=None, scale=0.5, mask=None)  # outside: nothing to count on
    assert context.uncached_attention == 2
