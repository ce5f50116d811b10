"""Sliding-window and sink variants of the Metal paged-attention kernel, as edits of its body
(each must apply exactly once, checked at import, as `metal_quant` and `metal_variants` do),
so they compose with the quantized and the partial (split-K) bodies.

- Window (template constant `WINDOW`, a model's own W: one pipeline per model): a query row
  sees keys `first_key = max(0, visible - WINDOW)` .. `visible - 1`, and its threadgroup walks
  only their blocks (a split-K part's blocks count from the window's first block). Every
  block walked holds at least one key the row sees, so each block max stays a real score.
- Sinks (input `sinks`, `(n_heads,)` float32 logits): the plain and quantized bodies add
  `exp2(sink * log2 e - best)` once to each head's denominator in their final merge of the
  simdgroups, with `best = max(best, sink)`. The partial body writes a part's softmax state
  and never sees them: `metal_variants.combine` adds the sink once, as one more part.
"""

from __future__ import annotations

from worker.attention.metal import quant as metal_quant
from worker.attention.metal import source as metal_source
from worker.attention.metal import variants as metal_variants

_VISIBLE = "    const int visible = context_lengths[seq] - num_queries + int(q_row) + 1;\n"
_FIRST_KEY = (
    "    // The sliding window: keys first_key .. visible - 1 (WINDOW of them, or all so far).\n"
    "    const int first_key = metal::max(0, visible - WINDOW);\n"
)
_LIVE = "        const bool live = int(lane) < valid;  // lane t scores token t of the block\n"
_WINDOWED_LIVE = (
    "        // lane t scores token t of the block, where the window holds it\n"
    "        const bool live = int(lane) < valid && blk * BLOCK_SIZE + int(lane) >= first_key;\n"
)
_PLAIN_START = "for (int blk = int(simd_group);"
_PART_START = "const int first_block = part * split[1];"
_SINKS_OLD = "        float numer = 0.0f;\n        float denom = 0.0f;\n"
_SINKS_NEW = (
    "        // The head's sink, a virtual key of value 0: counted once, in this last merge.\n"
    "        const float sink = float(sinks[int(kv_head) * GROUP + g]) * 1.4426950408889634f;\n"
    "        best = metal::max(best, sink);\n"
    "        float numer = 0.0f;\n"
    "        float denom = metal::exp2(sink - best);\n"
)


def _edit(body: str, old: str, new: str) -> str:
    if body.count(old) != 1:
        raise AssertionError(f"the kernel body no longer has exactly one {old.strip()!r}")
    return body.replace(old, new)


def windowed_body(body: str) -> str:
    """`body` (plain, quantized or partial) walking only the keys of each row's window."""
    body = _edit(body, _VISIBLE, _VISIBLE + _FIRST_KEY)
    body = _edit(body, _LIVE, _WINDOWED_LIVE)
    if _PART_START in body:
        return _edit(body, _PART_START, _PART_START.replace("= ", "= first_key / BLOCK_SIZE + "))
    return _edit(body, _PLAIN_START, _PLAIN_START.replace("= ", "= first_key / BLOCK_SIZE + "))


def sinks_body(body: str) -> str:
    """`body` (plain or quantized) adding each head's sink in its final merge."""
    return _edit(body, _SINKS_OLD, _SINKS_NEW)


# Checked at import: every edit applies to every body it is for.
for _body in (metal_source.KERNEL_BODY, metal_quant.KERNEL_BODY):
    sinks_body(windowed_body(_body))
for _body in (metal_variants.KERNEL_BODY, metal_variants.QUANTIZED_KERNEL_BODY):
    windowed_body(_body)


def kernel_spec(
    *, quantized: bool, partial: bool, windowed: bool, sinks: bool
) -> tuple[str, list[str], list[str], str]:
    """(name, input names, output names, body) of one variant for `mx.fast.metal_kernel`."""
    if sinks and partial:
        raise ValueError("a partial body never sees sinks: `metal_variants.combine` adds them")
    if partial:
        name, inputs, outputs, body = metal_variants.kernel_spec(quantized)
    elif quantized:
        name, inputs, body = (
            metal_quant.KERNEL_NAME,
            metal_quant.INPUT_NAMES,
            metal_quant.KERNEL_BODY,
        )
        outputs = metal_source.OUTPUT_NAMES
    else:
        name, inputs, body = (
            metal_source.KERNEL_NAME,
            metal_source.INPUT_NAMES,
            metal_source.KERNEL_BODY,
        )
        outputs = metal_source.OUTPUT_NAMES
    if windowed:
        name, body = name + "_windowed", windowed_body(body)
    if sinks:
        name, inputs, body = name + "_sinks", [*inputs, "sinks"], sinks_body(body)
    return name, list(inputs), list(outputs), body


def window_blocks(max_blocks: int, window: int | None, block_size: int) -> int:
    """Blocks one query row's threadgroups walk: at most those its window's keys span."""
    if window is None:
        return max_blocks
    return min(max_blocks, -(-(window - 1) // block_size) + 1)
