"""Which Metal kernel variant a forward runs, decided once per forward from host ints.

Variants: "plain" (`metal_source`, one threadgroup per KV head x row), "split" (split-K,
`metal_variants.split_k`) and "grouped" (prefix-grouped decode, `metal_variants.
prefix_grouped`). A variant other than "plain" is used only after it passed its own start-up
self-test on this machine (`worker.attention.selftest.verify_metal_variants`: matches the
reference and beats the plain kernel on the shape it is for); `VERDICTS` holds that.
Per forward: "grouped" where one-query rows share leading blocks enough to cut the K/V read
by `GROUPED_MIN_SAVING`; else "split" where the plain grid would leave the GPU's cores idle
(fewer than `TARGET_THREADGROUPS`) and rows are long; else "plain". The thresholds are
starting points from the arithmetic (M-series GPUs: 8-76 cores, several threadgroups each);
only timings on a Mac can tune them (`scripts/mac-check` reports each variant's).
"""

from __future__ import annotations

from typing import NamedTuple

import mlx.core as mx

from worker.attention.metal import source as metal_source
from worker.attention.metal.variants import MAX_GROUPED_QUERIES, GroupedPlan
from worker.attention.metal.window import window_blocks

VARIANTS = ("plain", "split", "grouped")
# what a forward may also ask of any variant: a sliding window, attention sinks. Each is
# self-tested at start-up too; where it did not pass, those calls run the MLX-ops reference
FEATURES = ("window", "sinks")
TARGET_THREADGROUPS = 128
MIN_PART_TOKENS = 256  # a part shorter than this costs more in merging than it wins
MAX_PARTS = 32
GROUPED_MIN_SAVING = 1.25  # K/V tokens read, plain / grouped, for grouping to pay


class _VariantVerdicts:
    """Per variant: None (self-tested here and enabled) or why it is not used."""

    def __init__(self):
        untested = "not self-tested in this process yet"
        self.reasons = {v: untested for v in (*VARIANTS[1:], *FEATURES)}

    def record(self, variant: str, ok: bool, reason: str) -> None:
        self.reasons[variant] = None if ok else reason

    def enabled(self, variant: str) -> bool:
        return self.reasons.get(variant, "unknown") is None


VERDICTS = _VariantVerdicts()


class MetalPlan(NamedTuple):
    variant: str  # one of VARIANTS
    parts: int = 1  # split-K: parts per row
    part_blocks: int = 0  # split-K: blocks per part
    grouped: GroupedPlan | None = None


def choose_split(threadgroups: int, max_blocks: int, block_size: int) -> tuple[int, int]:
    """(parts, blocks per part) for a grid of `threadgroups` over rows of up to `max_blocks`
    blocks; (1, max_blocks) where splitting does not pay."""
    min_part_blocks = max(1, MIN_PART_TOKENS // block_size)
    wanted = -(-TARGET_THREADGROUPS // max(1, threadgroups))
    parts = min(MAX_PARTS, wanted, max_blocks // min_part_blocks)
    if parts < 2:
        return 1, max(1, max_blocks)
    part_blocks = -(-max_blocks // parts)
    return -(-max_blocks // part_blocks), part_blocks


def rows_per_chunk(*, group: int, head_dim: int, block_size: int) -> int:
    """R: the most rows whose R x GQA queries one threadgroup holds in registers
    (MAX_GROUPED_QUERIES) with room for >= 2 simdgroups in threadgroup memory."""
    best = 1
    for rows in range(2, MAX_GROUPED_QUERIES // group + 1):
        fits = metal_source.pick_num_simdgroups(
            group=rows * group, head_dim=head_dim, block_size=block_size
        )
        if fits is None or fits < 2:
            break
        best = rows
    return best


def plan_split(
    lengths, num_queries: int, num_kv_heads: int, block_size: int, window: int | None = None
) -> MetalPlan:
    max_blocks = window_blocks(-(-max(lengths) // block_size), window, block_size)
    grid = len(lengths) * num_kv_heads * num_queries
    parts, part_blocks = choose_split(grid, max_blocks, block_size)
    return MetalPlan("split" if parts > 1 else "plain", parts, part_blocks)


def plan_grouped(
    tables: list[list[int]],
    lengths: list[int],
    *,
    block_size: int,
    num_kv_heads: int,
    group: int,
    head_dim: int,
    force: bool = False,
) -> MetalPlan | None:
    """Group one-query rows by their first block; a group's prefix is the leading blocks all
    its rows share, keeping each row's own last key outside it. None where grouping would not
    cut the K/V read by GROUPED_MIN_SAVING (unless `force`) or R is 1."""
    rows_each = rows_per_chunk(group=group, head_dim=head_dim, block_size=block_size)
    if rows_each < 2:
        return None
    by_first: dict[int, list[int]] = {}
    for row, blocks in enumerate(tables):
        by_first.setdefault(blocks[0] if lengths[row] > block_size else -1 - row, []).append(row)
    chunks, shared_of = [], [0] * len(tables)
    for rows in by_first.values():
        limit = min(lengths[r] - 1 for r in rows) // block_size
        first, shared = tables[rows[0]], 0
        while (
            len(rows) > 1
            and shared < limit
            and all(tables[r][shared] == first[shared] for r in rows)
        ):
            shared += 1
        if shared == 0:
            continue
        for r in rows:
            shared_of[r] = shared
        chunks += [(rows[i : i + rows_each], shared) for i in range(0, len(rows), rows_each)]
    grouped_read = sum(s * block_size for _, s in chunks) + sum(
        n - s * block_size for n, s in zip(lengths, shared_of, strict=True)
    )
    if not chunks or (not force and grouped_read * GROUPED_MIN_SAVING > sum(lengths)):
        return None
    width = max(s for _, s in chunks)
    slot_of_row = [0] * len(tables)
    for c, (rows, _) in enumerate(chunks):
        for r, row in enumerate(rows):
            slot_of_row[row] = c * rows_each + r
    suffix = [t[s:] for t, s in zip(tables, shared_of, strict=True)]
    suffix_lengths = [n - s * block_size for n, s in zip(lengths, shared_of, strict=True)]
    suffix_blocks = max(-(-n // block_size) for n in suffix_lengths)
    parts, part_blocks = choose_split(len(tables) * num_kv_heads, suffix_blocks, block_size)
    grouped = GroupedPlan(
        rows_per_chunk=rows_each,
        chunk_rows=_int32([rows + [rows[0]] * (rows_each - len(rows)) for rows, _ in chunks]),
        prefix_tables=_int32([_pad(tables[rows[0]][:s], width) for rows, s in chunks]),
        prefix_lengths=_int32([s * block_size for _, s in chunks]),
        slot_of_row=_int32(slot_of_row),
        has_prefix=mx.array([s > 0 for s in shared_of]),
        suffix_tables=_int32([_pad(t[:suffix_blocks], suffix_blocks) for t in suffix]),
        suffix_lengths=_int32(suffix_lengths),
        suffix_parts=parts,
        suffix_part_blocks=part_blocks,
    )
    return MetalPlan("grouped", grouped=grouped)


def plan_forward(
    *,
    lengths,
    num_queries,
    num_heads,
    k_pool,
    block_size,
    host_tables=None,
    only=None,
    window=None,
    **_,
) -> MetalPlan:
    """The variant this forward runs (see the module docstring). `only` forces one variant
    where it applies (the self-test and benchmarks time each on its own). A sliding `window`
    is never prefix-grouped (a row's window soon leaves what others share), and split-K
    splits the blocks of a window, not of the whole context."""
    num_kv_heads, head_dim = k_pool.shape[1], k_pool.shape[2]
    use = {v: (VERDICTS.enabled(v) if only is None else v == only) for v in VARIANTS[1:]}
    if use["grouped"] and num_queries == 1 and host_tables is not None and window is None:
        grouped = plan_grouped(
            host_tables,
            lengths,
            block_size=block_size,
            num_kv_heads=num_kv_heads,
            group=num_heads // num_kv_heads,
            head_dim=head_dim,
            force=only == "grouped",
        )
        if grouped is not None:
            return grouped
    if use["split"]:
        return plan_split(lengths, num_queries, num_kv_heads, block_size, window)
    return MetalPlan("plain")


def _pad(blocks: list[int], width: int) -> list[int]:
    return list(blocks) + [blocks[0] if blocks else 0] * (width - len(blocks))


def _int32(values) -> mx.array:
    return mx.array(values, dtype=mx.int32)


def prepare(**plan_inputs) -> dict:
    """The "metal" backend's per-forward preparation (`AttentionBackend.prepare`)."""
    return {"metal_plan": plan_forward(**plan_inputs)}
