"""Partial tails as a cache kind (worker/engine/caches/tails.py), asked through the coordinator
as the scheduler asks it: a stopped sequence's partial last block is kept and a later prompt's
hit copies it; the block is held from the hit until it is copied or given up; any kind can
veto it; a running prompt's tail is lent once; a fork in a partial block copies it per choice."""

from __future__ import annotations

import mlx.core as mx
import pytest

from shared.sampling import SamplingParams
from worker.engine.caches import CacheCoordinator, CacheKind, TailKind
from worker.engine.caches.states import NO_STATES
from worker.engine.sequence import Sequence
from worker.kv.block_pool import BlockPool
from worker.kv.radix_cache import RadixCache

BS = 8
TURN = [(5 * i + 3) % 90 + 2 for i in range(20)]  # 2 full blocks, then a tail of 4


@pytest.fixture
def pool():
    return BlockPool(16, BS, num_layers=1, num_kv_heads=1, head_dim=1, dtype=mx.float32)


@pytest.fixture
def cache(pool):
    return RadixCache(pool, BS)


@pytest.fixture
def kv(pool, cache):
    return CacheCoordinator(pool, cache, NO_STATES)


def computed(pool, cache, tokens: list[int]) -> Sequence:
    """A running sequence whose `tokens` are computed, its full blocks in the tree."""
    seq = Sequence("r", len(tokens), list(tokens), SamplingParams(), arrival=0)
    seq.block_ids = pool.allocate(pool.blocks_for_tokens(len(tokens)))
    seq.num_computed = len(tokens)
    seq.inserted_tokens = len(tokens) // BS * BS
    cache.insert(tokens[: seq.inserted_tokens], seq.block_ids)
    return seq


def stop(kv, seq: Sequence) -> None:
    """`seq` finishes the way the scheduler lets it go."""
    kv.cached(seq, seq.num_computed, running=False)
    kv.release(seq)
    kv.free(seq)


def admit(kv, cache, pool, prompt: list[int]):
    """The scheduler's hit, held; then the tail the kinds find after it."""
    hit = kv.hit(prompt)
    cache.lock(hit.match.node)
    pool.incref(hit.match.block_ids)
    return kv.tail(prompt, hit, hit.match)


def test_a_kept_tail_is_held_until_copied_or_given_up(kv, cache, pool):
    assert [type(k) for k in kv.kinds] == [TailKind]  # every model has it
    stop(kv, computed(pool, cache, TURN))
    (block,) = cache.partials.block_ids  # the 4 tokens after the 2 full blocks
    prompt = TURN + [7, 7, 7]
    hit = admit(kv, cache, pool, prompt)
    assert (hit.tail.block_id, hit.tail_tokens) == (block, 4)
    assert pool.ref_count(block) == 1  # held: making room cannot evict it
    kv.give_up(hit.match.block_ids, hit)
    cache.unlock(hit.match.node)
    assert pool.ref_count(block) == 0 and block in cache.partials  # kept, evictable again
    hit = admit(kv, cache, pool, prompt)
    seq = Sequence("again", len(prompt), prompt, SamplingParams(), arrival=1)
    seq.block_ids, seq.num_computed = list(hit.match.block_ids), hit.match.num_tokens
    kv.start(seq, hit)
    assert seq.num_computed == 20 and len(seq.block_ids) == 3
    assert seq.block_ids[2] != block and pool.ref_count(block) == 0  # a copy, not shared
    assert cache.partials.hit_tokens == 4
    cache.check_integrity()


class NoTails(CacheKind):
    cannot = {"tails": "this kind keeps nothing for a partial block"}


class CannotCopy(CacheKind):
    def tail(self, partial):
        return None


@pytest.mark.parametrize("veto", [NoTails, CannotCopy])
def test_any_kind_can_veto_a_tail_and_nothing_is_held(kv, cache, pool, veto):
    stop(kv, computed(pool, cache, TURN))
    (block,) = cache.partials.block_ids
    kv.register(veto())
    hit = admit(kv, cache, pool, TURN + [7])
    assert hit.tail is None and hit.tail_tokens == 0
    assert pool.ref_count(block) == 0


def test_no_tail_after_a_match_the_tree_did_not_end(kv, cache, pool):
    """A hit extended from disk (another match) ends where no tail hangs: none is looked for."""
    stop(kv, computed(pool, cache, TURN))
    hit = kv.hit(TURN + [7])
    extended = hit.match._replace(block_ids=list(hit.match.block_ids))
    assert kv.tail(TURN + [7], hit, extended).tail is None
    assert kv.tail(TURN + [7], hit._replace(tails=False), hit.match).tail is None


def test_a_running_prompt_lends_its_tail_once_then_keeps_it(kv, cache, pool):
    seq = computed(pool, cache, TURN)
    kv.cached(seq, 20, running=True)
    kv.cached(seq, 20, running=True)  # (asked again: lent already)
    assert cache.partials.is_live(seq.block_ids[2]) and len(cache.partials) == 0
    hit = admit(kv, cache, pool, TURN + [7])
    assert hit.tail.block_id == seq.block_ids[2]  # a later prompt may copy it meanwhile
    kv.give_up(hit.match.block_ids, hit)
    cache.unlock(hit.match.node)
    seq.tokens.append(9)
    seq.num_computed = 21
    stop(kv, seq)
    assert not cache.partials.is_live(seq.block_ids[2])
    assert cache.partials.tails_of(hit.match.node) == {tuple(TURN[16:] + [9]): seq.block_ids[2]}
    cache.check_integrity()


@pytest.mark.parametrize(("length", "copies"), [(20, True), (16, False)])
def test_a_fork_in_a_partial_block_copies_it_per_choice(kv, cache, pool, length, copies):
    parent = computed(pool, cache, TURN[:length])
    parent.forks = 2
    assert kv.fork_blocks(parent) == (2 if copies else 0)
    children = [parent.fork(choice) for choice in (1, 2)]
    for child in children:
        kv.fork(parent, child)
    last = parent.block_ids[-1]
    assert [c.block_ids[-1] != last for c in children] == [copies, copies]
    assert pool.ref_count(last) == (1 if copies else 3)
    assert [c.block_ids[:-1] for c in children] == [parent.block_ids[:-1]] * 2
