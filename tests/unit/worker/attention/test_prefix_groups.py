"""Shared-prefix attention over nested groups (rows sharing 1, 2 and 3 blocks), in one batched
op per layer, with the gathered prefixes kept across ticks and dropped when a block is reused
or written: against the plain gather, on random and on quantized pools."""

from __future__ import annotations

import io
import math
import random

import mlx.core as mx
import numpy as np
import pytest

from worker.attention import shared_prefix
from worker.attention.mlx_ops import gather_attention
from worker.attention.prefix_kv import PrefixKV, group_rows
from worker.attention.shared_prefix import plan_shared_prefixes, shared_prefix_attention
from worker.attention.tiles import prepare_tiles
from worker.kv.block_pool import BlockPool

BLOCK, KV_HEADS, HEADS, DIM = 4, 2, 6, 32
SCALE = 1 / math.sqrt(DIM)


def nested_rows():
    """A header block h for all; t after it for five rows; x after that for three; y for
    two; own blocks after. Lengths end each row inside its own block."""
    h, t, x, y = 11, 12, 13, 14
    own = iter(range(20, 99))
    rows = [
        ([h, t, x, y, next(own)], 4 * BLOCK + 2),  # 0: shares 4 blocks with 1
        ([h, t, x, y, next(own)], 4 * BLOCK + 3),  # 1
        ([h, t, x, next(own)], 3 * BLOCK + 1),  # 2: shares 3 blocks with 0, 1
        ([h, t, next(own)], 2 * BLOCK + 4),  # 3: shares 2 blocks with 0-2 and 4
        ([h, t, next(own)], 2 * BLOCK + 1),  # 4
        ([h, next(own)], BLOCK + 3),  # 5: shares 1 block with everyone
        ([h, next(own)], BLOCK + 2),  # 6
        ([next(own), next(own)], 2 * BLOCK),  # 7: shares nothing
    ]
    return [b for b, _ in rows], [n for _, n in rows]


def pools(num_blocks: int, seed: int = 1):
    shape = (num_blocks * BLOCK, KV_HEADS, DIM)
    k = mx.random.normal(shape, key=mx.random.key(seed))
    v = mx.random.normal(shape, key=mx.random.key(seed + 1))
    return k, v


def reference(queries, k_pool, v_pool, tables, lengths):
    width = max(len(t) for t in tables)
    padded = mx.array([t + [0] * (width - len(t)) for t in tables], dtype=mx.int32)
    return gather_attention(
        queries,
        k_pool,
        v_pool,
        padded,
        mx.array(lengths, dtype=mx.int32),
        scale=SCALE,
        block_size=BLOCK,
        max_context=max(lengths),
    )


def test_rows_group_by_their_deepest_shared_run_where_that_reads_fewer_blocks():
    tables, lengths = nested_rows()
    # rows 0-2 share 3 blocks (0, 1 a 4th, not worth a group of its own), rows 3-4 two, 5-6 one
    assert sorted(group_rows(tables, lengths, BLOCK)) == [([0, 1, 2], 3), ([3, 4], 2), ([5, 6], 1)]
    # a whole fleet behind one long preamble, tenants diverging a block later: one group
    preamble = list(range(1, 9))
    fleet = [preamble + [50 + i // 4, 60 + i] for i in range(8)]
    assert group_rows(fleet, [10 * BLOCK - 1] * 8, BLOCK) == [(list(range(8)), 8)]
    # tenants that share a short header and long tails of their own: a group per tenant
    tenants = [[1] + [10 * (1 + i // 2) + j for j in range(6)] + [90 + i] for i in range(4)]
    assert sorted(group_rows(tenants, [8 * BLOCK] * 4, BLOCK)) == [([0, 1], 7), ([2, 3], 7)]
    # a row's own last block is never shared (it keeps its own key after its prefix)
    assert group_rows([[1, 2], [1, 2]], [2 * BLOCK, 2 * BLOCK], BLOCK) == [([0, 1], 1)]


@pytest.mark.parametrize("seed", range(20))
def test_rows_sharing_one_table_group_as_rows_over_copies_of_it(seed):
    # a folded prefill chunk hands hundreds of rows the same table object: its path is walked
    # once; the groups must be those of the same rows over tables of their own
    rng = random.Random(seed)
    shared = [rng.randrange(100) for _ in range(rng.randrange(1, 6))]
    tables = [shared + [rng.randrange(100, 200) for _ in range(rng.randrange(4))] for _ in range(3)]
    rows, lengths = [], []
    for _ in range(rng.randrange(2, 30)):
        table = rng.choice(tables)
        rows.append(table)
        lengths.append(rng.randrange(1, len(table) * BLOCK + 1))
    copies = [list(t) for t in rows]
    assert sorted(group_rows(rows, lengths, BLOCK)) == sorted(group_rows(copies, lengths, BLOCK))


@pytest.mark.parametrize("seed", range(3))
def test_nested_groups_attend_as_the_plain_gather(seed, monkeypatch):
    monkeypatch.setattr(shared_prefix, "SHARED_PREFIX_MIN_SAVING", 0.0)
    tables, lengths = nested_rows()
    order = list(range(len(tables)))
    random.Random(seed).shuffle(order)
    tables, lengths = [tables[i] for i in order], [lengths[i] for i in order]
    k, v = pools(100, seed)
    q = mx.random.normal((len(tables), HEADS, 1, DIM), key=mx.random.key(seed + 7))
    plan = plan_shared_prefixes(tables, lengths, BLOCK, KV_HEADS)
    # the three nested groups, and row 7 (sharing nothing) on its own first block
    assert plan is not None and sorted(plan.depths) == [1, 1, 2, 3]
    got = shared_prefix_attention(q, k, v, plan, scale=SCALE)
    assert mx.abs(got - reference(q, k, v, tables, lengths)).max().item() < 1e-5


def graph_ops(out: mx.array) -> int:
    dot = io.StringIO()
    mx.export_to_dot(dot, out)
    return dot.getvalue().count("shape=rectangle")


def tenant_rows(tenants: int, rows: int = 16, prefix_blocks: int = 6):
    blocks = iter(range(1, 999))
    shared = [[next(blocks) for _ in range(prefix_blocks)] for _ in range(tenants)]
    tables = [shared[i % tenants] + [next(blocks)] for i in range(rows)]
    return tables, [prefix_blocks * BLOCK + 1 + i % BLOCK for i in range(rows)]


def test_one_batched_op_per_layer_whatever_the_number_of_groups():
    counts, store = {}, PrefixKV([0] * 200)
    for tenants in (1, 4, 8):
        tables, lengths = tenant_rows(tenants)
        k, v = pools(200)
        q = mx.random.normal((len(tables), HEADS, 1, DIM), key=mx.random.key(3))
        plan = plan_shared_prefixes(tables, lengths, BLOCK, KV_HEADS, store)
        assert plan is not None and len(plan.depths) == tenants
        mx.eval(k, v, q, [a for a in plan if isinstance(a, mx.array)])
        first = shared_prefix_attention(q, k, v, plan, scale=SCALE)  # gathers the prefixes
        first_ops = graph_ops(first)
        mx.eval(first)
        again = shared_prefix_attention(q, k, v, plan, scale=SCALE)  # kept: no prefix gather
        counts[tenants] = graph_ops(again), first_ops
        assert mx.array_equal(first, again).item()
    # graph nodes as export_to_dot counts them (broadcasts and reshapes included): the
    # per-group chain took 93 / 177 / 285 at 1 / 4 / 8 groups; once kept, 97 at any number
    # of groups (99 at one: its own entry, viewed as a stack of one). The tick that gathers
    # reads each group's prefix, then stacks them: that graph grows with the groups, on the
    # ticks where the groups change only.
    assert counts[4][0] == counts[8][0] <= 97 and counts[1][0] <= counts[4][0] + 2, counts
    assert counts[1][1] < counts[4][1] < counts[8][1], counts


def decode_pool(kv_bits=None, num_blocks=16):
    pool = BlockPool(
        num_blocks,
        BLOCK,
        num_layers=1,
        num_kv_heads=KV_HEADS,
        head_dim=DIM,
        dtype=mx.float32,
        kv_bits=kv_bits,
        kv_group_size=32,
    )
    return pool


def fill(pool: BlockPool, blocks: list[int], seed: int):
    slots = mx.array([b * BLOCK + i for b in blocks for i in range(BLOCK)], dtype=mx.int32)
    shape = (len(blocks) * BLOCK, KV_HEADS, DIM)
    pool.k[0][slots] = mx.random.normal(shape, key=mx.random.key(seed))
    pool.v[0][slots] = mx.random.normal(shape, key=mx.random.key(seed + 1))
    mx.eval(pool.k, pool.v)


def dequantized(pool: BlockPool):
    k, v = pool.k[0], pool.v[0]
    if hasattr(k, "take"):
        every = mx.arange(k.shape[0])
        return k.take(every), v.take(every)
    return k, v


def attend(pool: BlockPool, store: PrefixKV, tables, lengths, rows_seen: int = 1):
    q = mx.random.normal((len(tables), HEADS, 1, DIM), key=mx.random.key(rows_seen))
    tiles = prepare_tiles(lengths, 1, HEADS, pool.k[0], BLOCK, host_tables=tables, prefix_kv=store)
    assert tiles.shared is not None
    got = shared_prefix_attention(q, pool.k[0], pool.v[0], tiles.shared, scale=SCALE)
    want = reference(q, *dequantized(pool), tables, lengths)
    assert np.allclose(np.array(got), np.array(want), atol=1e-4)
    return got


@pytest.mark.parametrize("kv_bits", [None, 8, 4])
@pytest.mark.parametrize("rows", [2, 6])  # 2 * 3 query rows per KV head: quantized matmul
def test_a_kept_prefix_is_reused_and_dropped_when_its_blocks_are_reused(kv_bits, rows):
    pool = decode_pool(kv_bits)
    store = PrefixKV(pool.versions)
    prefix = pool.allocate(3)
    fill(pool, prefix, 1)
    own = [pool.allocate(1) for _ in range(rows)]
    for i, b in enumerate(own):
        fill(pool, b, 10 + i)
    tables = [prefix + b for b in own]
    lengths = [3 * BLOCK + 1 + i % BLOCK for i in range(rows)]
    attend(pool, store, tables, lengths)
    assert store.misses == 2 and store.hits == 0  # K and V gathered once
    attend(pool, store, tables, lengths, 2)
    assert store.hits == 2 and store.misses == 2
    # copy-on-write of a shared block leaves the original (and what was kept of it) alone
    pool.incref(prefix)
    copy = pool.copy_on_write(prefix[2])
    assert copy != prefix[2]
    attend(pool, store, tables, lengths, 3)
    assert store.hits == 4
    # the prefix freed (evicted), its blocks allocated to another prompt and written anew
    pool.decref([*prefix[:2], copy])
    for b in own:
        pool.decref(b)
    pool.decref(prefix)
    reused = pool.allocate(pool.num_free)
    assert set(prefix) <= set(reused)
    fill(pool, reused, 99)
    attend(pool, store, tables, lengths, 4)  # same block ids, new content: gathered again
    assert store.misses == 4


def test_a_forward_writing_a_block_drops_the_kept_prefixes_that_hold_it():
    # a pool without allocation versions (a TP follower's): writes alone keep it exact
    k, v = pools(40)
    tables, lengths = tenant_rows(2, rows=4, prefix_blocks=6)
    store = PrefixKV([0] * 40)
    plan = plan_shared_prefixes(tables, lengths, BLOCK, KV_HEADS, store)
    mx.eval(shared_prefix_attention(mx.zeros((4, HEADS, 1, DIM)), k, v, plan, scale=SCALE))
    assert len(store.entries) == 1  # the two tenants' prefixes, stacked
    # a prefill forward over another sequence that was given block tables[0][1]
    prepare_tiles([2 * BLOCK], 3, HEADS, k, BLOCK, host_tables=[[7, tables[0][1]]], prefix_kv=store)
    assert not store.entries and store.nbytes == 0


def test_a_group_that_comes_or_goes_regathers_only_its_own_prefix():
    k, v = pools(400)
    tables, lengths = tenant_rows(3, rows=6, prefix_blocks=6)
    q = mx.zeros((6, HEADS, 1, DIM))
    store = PrefixKV([0] * 400)

    def tick(rows):
        picked = [tables[r] for r in rows], [lengths[r] for r in rows]
        plan = plan_shared_prefixes(*picked, BLOCK, KV_HEADS, store)
        got = shared_prefix_attention(q[: len(rows)], k, v, plan, scale=SCALE)
        assert mx.abs(got - reference(q[: len(rows)], k, v, *picked)).max().item() < 1e-5

    tick([0, 1, 3, 4])  # tenants 0 and 1: both prefixes gathered (K and V)
    assert (store.hits, store.misses) == (0, 4)
    tick([0, 1, 3, 4])  # the same groups: the stack, kept
    assert (store.hits, store.misses) == (4, 4)
    tick([0, 2, 3, 5])  # tenant 1 left, tenant 2 came: only its prefix is gathered
    assert (store.hits, store.misses) == (6, 6)


def test_kept_prefixes_stay_within_their_budget():
    cache = PrefixKV([0] * 400, budget=3 * 2 * 3 * BLOCK * KV_HEADS * DIM * 4)  # three prefixes
    k, v = pools(400)
    for shift in range(6):
        tables, lengths = tenant_rows(1, rows=4, prefix_blocks=3)
        tables = [[b + 20 * shift for b in t] for t in tables]
        plan = plan_shared_prefixes(tables, lengths, BLOCK, KV_HEADS, cache)
        mx.eval(shared_prefix_attention(mx.zeros((4, HEADS, 1, DIM)), k, v, plan, scale=SCALE))
        assert cache.nbytes <= cache.budget
    assert len(cache.entries) == 3


def test_engine_decodes_nested_tenants_from_kept_prefixes_and_matches_mlx_lm():
    from shared.sampling import SamplingParams
    from tests.support.engine_fixtures import (
        make_engine,
        reference_greedy,
        run_to_completion,
        tiny_model,
    )

    model = tiny_model()
    engine = make_engine(model)  # block size 8
    rng = random.Random(5)
    header = [rng.randrange(3, 90) for _ in range(24)]  # a preamble all tenants share
    tenants = [header + [rng.randrange(3, 90) for _ in range(16)] for _ in range(2)]
    prompts = {
        f"r{i}": tenants[i % 2] + [rng.randrange(3, 90) for _ in range(2 + i)] for i in range(6)
    }
    for rid, p in prompts.items():
        engine.add_request(rid, p, SamplingParams(max_tokens=10, temperature=0.0))
    outputs = run_to_completion(engine)
    for rid, p in prompts.items():
        assert outputs[rid] == reference_greedy(model, p, 10), rid
    kept = engine.runner.prefix_kv
    assert kept.hits > kept.misses > 0  # decode ticks read kept prefixes
