"""A chunked group's span and mask (`GroupSpan(chunk=True)`), and the per-row ranges Llama 4's
module draws from `cache.offset` (`worker.runner.row_ranges`)."""

from __future__ import annotations

import mlx.core as mx
import pytest

from worker.attention import ForwardContext, building
from worker.runner.layer_groups import GroupSpan
from worker.runner.row_ranges import _CORE

BLOCK, CHUNK = 4, 8


def _span(context_lengths: list[int], queries: int, chunk: bool = True) -> GroupSpan:
    blocks = -(-max(context_lengths) // BLOCK)
    tables = mx.array([list(range(blocks))] * len(context_lengths), dtype=mx.int32)
    return GroupSpan(tables, context_lengths, queries, BLOCK, CHUNK, chunk=chunk)


@pytest.mark.parametrize("lengths", [[5, 20], [17, 9], [24, 31]])
@pytest.mark.parametrize("queries", [1, 3])
def test_a_query_sees_its_own_chunk_up_to_itself(lengths, queries):
    span = _span(lengths, queries)
    key_pos, query_pos = span.key_pos.tolist(), span.query_pos.tolist()
    mask = span.mask.tolist()
    for b, length in enumerate(lengths):
        for i, q in enumerate(query_pos[b]):
            seen = {k for k, m in zip(key_pos[b], mask[b][0][i], strict=True) if m}
            assert seen == set(range(q // CHUNK * CHUNK, q + 1))
            assert q < length


@pytest.mark.parametrize(
    ("lengths", "queries", "width"),
    [([12], 1, 4), ([16], 1, 8), ([17], 1, 1), ([17, 12], 1, 4), ([20], 6, 12), ([40], 1, 8)],
)
def test_a_chunked_span_gathers_from_its_first_querys_chunk_start(lengths, queries, width):
    """Each row needs keys from ⌊(c - L) / C⌋·C on, the widest row sets the width; never more
    than a window of C gathers (L + C - 1)."""
    span = _span(lengths, queries)
    assert span.width == width <= queries + CHUNK - 1
    for b, length in enumerate(lengths):
        first = span.key_pos[b, 0].item()
        assert first <= (length - queries) // CHUNK * CHUNK


def test_a_window_of_the_same_size_sees_across_the_chunk_start():
    lengths = [12]
    chunked, window = _span(lengths, 1), _span(lengths, 1, chunk=False)
    assert window.width == CHUNK and chunked.width == 4  # only keys 8..11 are gathered
    assert sum(chunked.mask.reshape(-1).tolist()) == 4  # 8..11
    assert sum(window.mask.reshape(-1).tolist()) == 8  # 4..11
    assert chunked.mask_for(None) is chunked.mask


def test_ranges_over_row_offsets_are_per_row_inside_our_forwards_only():
    offsets = mx.array([3, 10], dtype=mx.int32)
    assert _CORE.arange(2, 5).tolist() == [2, 3, 4]  # mlx-lm's own calls: unchanged
    with building(ForwardContext(offsets, queries=3)):
        rows = _CORE.arange(offsets + 1, offsets + 4)
        assert _CORE.arange(0, 2).tolist() == [0, 1]
    assert rows.shape == (2, 3, 1)  # [:, None] then lines up with (B, heads, L, dim)
    assert rows[..., 0].tolist() == [[4, 5, 6], [11, 12, 13]]
    with pytest.raises(TypeError):
        _CORE.arange(offsets, offsets + 3)  # outside our forwards: mlx.core's refusal
