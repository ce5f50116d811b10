"""Shared-prefix attention (one-query rows that share leading blocks attend the prefix once per
group) against the plain gather, on random pools: exact up to float rounding."""

from __future__ import annotations

import math
import random

import mlx.core as mx
import pytest

from worker.attention import shared_prefix, tiles
from worker.attention.mlx_ops import gather_attention
from worker.attention.prefix_kv import PrefixKV
from worker.attention.shared_prefix import plan_shared_prefixes, shared_prefix_attention
from worker.attention.tiles import prepare_tiles, tiled_attention

BLOCK, KV_HEADS, HEADS, DIM = 4, 2, 6, 8


def batch(rng: random.Random, rows: list[tuple[list[int], int]]):
    num_blocks = 1 + max(b for blocks, _ in rows for b in blocks)
    k_pool = mx.random.normal((num_blocks * BLOCK, KV_HEADS, DIM), key=mx.random.key(1))
    v_pool = mx.random.normal((num_blocks * BLOCK, KV_HEADS, DIM), key=mx.random.key(2))
    width = max(len(blocks) for blocks, _ in rows)
    tables = mx.array([b + [0] * (width - len(b)) for b, _ in rows], dtype=mx.int32)
    lengths = [n for _, n in rows]
    queries = mx.random.normal((len(rows), HEADS, 1, DIM), key=mx.random.key(rng.randrange(99)))
    return queries, k_pool, v_pool, tables, lengths


def reference(queries, k_pool, v_pool, tables, lengths):
    return gather_attention(
        queries,
        k_pool,
        v_pool,
        tables,
        mx.array(lengths, dtype=mx.int32),
        scale=1 / math.sqrt(DIM),
        block_size=BLOCK,
        max_context=max(lengths),
    )


def tenants_batch(rng: random.Random):
    """Rows of three tenants (shared leading blocks), one of them branching after two blocks,
    a row sharing nothing, and one-token rows of one sequence (a MIXED step's prefill)."""
    blocks = iter(rng.sample(range(1, 400), 399))
    tenants = [[next(blocks) for _ in range(6)] for _ in range(3)]
    rows = []
    for t in range(3):
        for _ in range(3):
            tail = [next(blocks) for _ in range(2)]
            rows.append((tenants[t] + tail, 6 * BLOCK + rng.randrange(1, 2 * BLOCK + 1)))
    rows.append((tenants[0][:2] + [next(blocks) for _ in range(6)], 7 * BLOCK + 2))  # branches
    rows.append(([next(blocks) for _ in range(5)], 5 * BLOCK))  # alone
    own = [next(blocks) for _ in range(8)]
    rows += [(own, n) for n in range(25, 31)]  # one sequence's rows at positions 24..29
    rng.shuffle(rows)
    return rows


@pytest.mark.parametrize("seed", range(4))
def test_shared_prefix_attention_equals_the_plain_gather(seed, monkeypatch):
    # every kind of row, whether or not the plan would pay on this batch
    monkeypatch.setattr(shared_prefix, "SHARED_PREFIX_MIN_SAVING", 0.0)
    rng = random.Random(seed)
    rows = tenants_batch(rng)
    queries, k_pool, v_pool, tables, lengths = batch(rng, rows)
    plan = plan_shared_prefixes([b for b, _ in rows], lengths, BLOCK, KV_HEADS)
    assert plan is not None
    got = shared_prefix_attention(queries, k_pool, v_pool, plan, scale=1 / math.sqrt(DIM))
    want = reference(queries, k_pool, v_pool, tables, lengths)
    assert mx.abs(got - want).max().item() < 1e-5


def decode_batch(rng: random.Random):
    """Decode rows of four tenants: long shared prefixes, short own tails."""
    blocks = iter(rng.sample(range(1, 400), 399))
    tenants = [[next(blocks) for _ in range(12)] for _ in range(4)]
    return [
        (tenants[i % 4] + [next(blocks) for _ in range(2)], 12 * BLOCK + rng.randrange(1, 8))
        for i in range(12)
    ]


def test_the_tiled_backend_takes_the_shared_prefix_plan_only_where_it_pays():
    rng = random.Random(7)
    rows = decode_batch(rng)
    queries, k_pool, v_pool, tables, lengths = batch(rng, rows)
    context = mx.array(lengths, dtype=mx.int32)
    host = [b for b, _ in rows]
    tiles = prepare_tiles(
        lengths,
        1,
        HEADS,
        k_pool,
        BLOCK,
        block_tables=tables,
        context_lengths=context,
        host_tables=host,
    )
    assert tiles.shared is not None
    got = tiled_attention(
        queries,
        k_pool,
        v_pool,
        tables,
        context,
        scale=1 / math.sqrt(DIM),
        block_size=BLOCK,
        max_context=max(lengths),
        tiles=tiles,
    )
    assert mx.abs(got - reference(queries, k_pool, v_pool, tables, lengths)).max().item() < 1e-5
    # nothing shared: the plain tile plan
    alone = [([10 * i + j for j in range(1, 6)], 5 * BLOCK) for i in range(1, 5)]
    lone_lengths = [n for _, n in alone]
    assert plan_shared_prefixes([b for b, _ in alone], lone_lengths, BLOCK, KV_HEADS) is None
    # several queries per row (a prefill chunk, drafts): never
    tiles = prepare_tiles(lengths, 2, HEADS, k_pool, BLOCK, host_tables=host)
    assert tiles.shared is None


def test_a_row_sharing_nothing_leaves_the_others_on_the_shared_plan():
    # Before, its whole context became its "suffix", every row's suffix was padded to it and
    # the plan no longer paid: one lone row sent the whole batch to the tiled gather.
    rng = random.Random(11)
    rows = decode_batch(rng)
    rows.insert(5, ([500 + i for i in range(20)], 20 * BLOCK - 1))  # a long lone row
    queries, k_pool, v_pool, tables, lengths = batch(rng, rows)
    host = [b for b, _ in rows]
    context = mx.array(lengths, dtype=mx.int32)
    prepared = prepare_tiles(
        lengths,
        1,
        HEADS,
        k_pool,
        BLOCK,
        block_tables=tables,
        context_lengths=context,
        host_tables=host,
    )
    plan = prepared.shared
    assert plan is not None and plan.rows.tolist() == [r for r in range(13) if r != 5]
    assert plan.loose[0].tolist() == [5]
    # the scheduler's price: each tenant's prefix once, the grouped rows' suffixes padded to
    # the widest of them, and the lone row's whole context
    widest = max(n for _, n in rows if n < 20 * BLOCK - 1) - 12 * BLOCK
    assert shared_prefix.gathered_keys(host, lengths, BLOCK) == (
        4 * 12 * BLOCK + 12 * widest + 20 * BLOCK - 1
    )
    got = tiled_attention(
        queries,
        k_pool,
        v_pool,
        tables,
        context,
        scale=1 / math.sqrt(DIM),
        block_size=BLOCK,
        max_context=max(lengths),
        tiles=prepared,
    )
    assert mx.abs(got - reference(queries, k_pool, v_pool, tables, lengths)).max().item() < 1e-5


def test_a_lone_row_no_deeper_than_the_groups_gets_a_group_of_its_own():
    # its prefix then stays gathered across ticks, as a tenant's does
    rng = random.Random(12)
    rows = decode_batch(rng)
    rows.insert(3, ([600 + i for i in range(14)], 13 * BLOCK + 2))  # 13 blocks + 2 tokens
    queries, k_pool, v_pool, tables, lengths = batch(rng, rows)
    store = PrefixKV([0] * 700)
    plan = plan_shared_prefixes([b for b, _ in rows], lengths, BLOCK, KV_HEADS, store)
    assert plan is not None and plan.rows is None  # every row in a group
    assert sorted(plan.depths) == [12] * 5  # four tenants, and the lone row cut at their depth
    got = shared_prefix_attention(queries, k_pool, v_pool, plan, scale=1 / math.sqrt(DIM))
    assert mx.abs(got - reference(queries, k_pool, v_pool, tables, lengths)).max().item() < 1e-5


def test_engine_decodes_tenants_through_the_shared_prefix_plan_and_matches_mlx_lm(monkeypatch):
    from shared.sampling import SamplingParams
    from tests.support.engine_fixtures import (
        make_engine,
        reference_greedy,
        run_to_completion,
        tiny_model,
    )

    calls = []
    original = tiles.shared_prefix_attention

    def spy(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(tiles, "shared_prefix_attention", spy)
    model = tiny_model()
    engine = make_engine(model)
    rng = random.Random(3)
    system = [[rng.randrange(3, 90) for _ in range(40)] for _ in range(2)]
    prompts = {
        f"r{i}": system[i % 2] + [rng.randrange(3, 90) for _ in range(3 + i)] for i in range(6)
    }
    for rid, p in prompts.items():
        engine.add_request(rid, p, SamplingParams(max_tokens=10, temperature=0.0))
    outputs = run_to_completion(engine)
    for rid, p in prompts.items():
        assert outputs[rid] == reference_greedy(model, p, 10), rid
    assert calls  # the decode steps went through it
    # the roofline's K/V per tick with each shared prefix read once: less than every row's
    phases = engine.phases()
    assert 0 < phases.decode_kv_shared_bytes_mean < phases.decode_kv_bytes_mean
