"""Stateful property test: sequences driving the block pool and radix cache like an engine.

A plain model keeps what should be true: the cached block-aligned prefixes (prefix -> block),
each prefix's last access, each sequence's blocks and locks, the partial tails kept after
finished sequences. After every step the pool and the tree must agree with it, and events
replayed into a dict must give the tree's block hashes (tails emit none). Admission copies the
best partial block (a tail or a child's first block) into a fresh block: the cached one never
changes. Tiny vocabulary and block size so prefixes collide often.
"""

from collections import Counter
from dataclasses import dataclass

import mlx.core as mx
import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from shared.hashing import hash_block
from shared.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from worker.kv import BlockPool, KVCacheError, RadixCache

BS = 3
NUM_BLOCKS = 32
MAX_SEQS = 5
# A few shared stems plus a random tail: prompts share prefixes and diverge, like chats do.
STEMS = [(), (0, 0), (0, 0, 1, 1), (0, 0, 1, 2, 3), (1, 2, 3, 0, 1, 2)]
token_lists = st.builds(
    lambda stem, tail: list(stem) + tail,
    st.sampled_from(STEMS),
    st.lists(st.integers(0, 3), max_size=6),
)
seq_index = st.integers(min_value=0, max_value=100)


@dataclass(eq=False)
class Seq:
    tokens: list[int]
    blocks: list[int]  # one reference each; the last block may be partial
    node: object | None  # the node this sequence locked, if any
    lock_prefix: tuple[int, ...] = ()


def common(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def prefixes(tokens):
    """The block-aligned prefixes of the full blocks of `tokens`, shortest first."""
    return [tuple(tokens[:end]) for end in range(BS, len(tokens) - len(tokens) % BS + 1, BS)]


class KVMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.pool = BlockPool(
            NUM_BLOCKS, BS, num_layers=1, num_kv_heads=1, head_dim=1, dtype=mx.float32
        )
        self.events = []
        self.cache = RadixCache(self.pool, BS, on_event=self.events.append)
        self.cached = {}  # block-aligned prefix -> block id
        self.hashes = {}  # block-aligned prefix -> its chained hash
        self.last_access = {}  # block-aligned prefix -> model clock
        self.snapshots = {}  # cached block id -> its K/V when it entered the tree
        self.clock = 0
        self.seqs = []
        self.extra_locks = []  # (node, prefix) locked by a bare match
        self.hits = self.misses = self.partial_hits = 0
        self.tails = {}  # (full-block prefix, tail tokens) -> block id
        self.live = {}  # a running sequence's partial block -> (prefix, tail tokens)
        self.replayed = {}  # block hash -> token ids, from events only
        self.next_value = 1.0

    # ---- model helpers ----

    def expected_match(self, tokens):
        matched = []
        for prefix in prefixes(tokens):
            if prefix not in self.cached:
                break
            matched.append(prefix)
        return matched

    def expected_partial(self, tokens, pos):
        """The longest run any cached block offers after the matched `pos` tokens."""
        want, head = tuple(tokens[pos : pos + BS - 1]), tuple(tokens[:pos])
        keys = [t for (prefix, t) in self.tails if prefix == head]
        keys += [p[pos:] for p in self.cached if len(p) == pos + BS and p[:pos] == head]
        keys += [t for p, t in self.live.values() if p == head]
        return max((common(key, want) for key in keys), default=0)

    def keep_tail(self, seq):
        """insert_tail after insert: the partial last block is kept unless a cached block
        already starts with its tokens, or another sequence shares it."""
        self.forget(seq)  # a live block may become a tail
        full = len(seq.tokens) - len(seq.tokens) % BS
        prefix, tail = tuple(seq.tokens[:full]), tuple(seq.tokens[full:])
        block = seq.blocks[full // BS] if tail else None
        keys = [t for (p, t) in self.tails if p == prefix]
        keys += [p[full:] for p in self.cached if len(p) == full + BS and p[:full] == prefix]
        expect = (
            bool(tail)
            and all(p in self.cached for p in prefixes(seq.tokens))
            and self.model_refs()[block] == 1
            and block not in {*self.cached.values(), *self.tails.values()}
            and not any(key[: len(tail)] == tail for key in keys)
        )
        assert self.cache.insert_tail(seq.tokens, seq.blocks) == expect
        self.clock += 1
        self.touch([p for p in prefixes(seq.tokens) if p in self.cached])
        if expect:
            refs = self.model_refs()
            for p, t in list(self.tails):
                if p == prefix and tail[: len(t)] == t and refs[self.tails[(p, t)]] == 0:
                    del self.snapshots[self.tails.pop((p, t))]
            self.tails[(prefix, tail)] = block
            self.snapshots[block] = self.block_kv(block)

    def forget(self, seq):
        self.cache.partials.forget_live(seq.blocks)
        for block in seq.blocks:
            self.live.pop(block, None)

    def unheld_tails(self):
        refs = self.model_refs()
        return [b for b in self.tails.values() if refs[b] == 0]

    def model_refs(self):
        return Counter(block for seq in self.seqs for block in seq.blocks)

    def locked_prefixes(self):
        return [s.lock_prefix for s in self.seqs] + [prefix for _, prefix in self.extra_locks]

    def pinned(self, prefix, refs, locked):
        held = refs[self.cached[prefix]] > 0
        return held or any(
            lock[: len(prefix)] == prefix for lock in locked if len(lock) >= len(prefix)
        )

    def tree_nodes(self):
        """(node, block prefixes) for every node, parents before children."""
        out, stack = [], [(child, ()) for child in self.cache.root.children.values()]
        while stack:
            node, above = stack.pop()
            full = above + node.key
            blocks = [full[: len(above) + (i + 1) * BS] for i in range(node.num_blocks)]
            out.append((node, blocks))
            stack.extend((child, full) for child in node.children.values())
        return out

    def evictable_by_model(self):
        """Blocks of nodes with nothing pinned at or below them, and the evictable leaves."""
        refs, locked = self.model_refs(), self.locked_prefixes()
        nodes = self.tree_nodes()
        pinned_below = {}
        for node, blocks in reversed(nodes):  # children first
            pinned_below[id(node)] = any(self.pinned(p, refs, locked) for p in blocks) or any(
                pinned_below[id(c)] for c in node.children.values()
            )
        free_nodes = [(n, b) for n, b in nodes if not pinned_below[id(n)]]
        leaves = [blocks for node, blocks in free_nodes if node.is_leaf]
        return sum(len(blocks) for _, blocks in free_nodes), leaves

    def touch(self, prefix_list):
        for prefix in prefix_list:
            self.last_access[prefix] = self.clock

    def write(self, block, offsets):
        """Gives slots of `block` fresh K/V values, as a forward pass would."""
        for offset in offsets:
            slot = block * BS + offset
            self.pool.k[0][slot] = mx.full((1, 1), self.next_value)
            self.pool.v[0][slot] = mx.full((1, 1), -self.next_value)
            self.next_value += 1.0

    def block_kv(self, block):
        span = slice(block * BS, (block + 1) * BS)
        return np.array(self.pool.k[0][span]), np.array(self.pool.v[0][span])

    # ---- checked operations ----

    def match(self, tokens):
        result = self.cache.match_prefix(tokens)
        expected = self.expected_match(tokens)
        assert result.block_ids == [self.cached[p] for p in expected]
        assert result.num_tokens == len(expected) * BS
        assert result.node.key == (expected[-1][-result.node.num_blocks * BS :] if expected else ())
        self.clock += 1
        self.touch(expected)
        return result, (expected[-1] if expected else ())

    def admitted(self, result, tokens):
        """The admission went through: its hit counts now, not at the match (a match that
        backs out counts nothing)."""
        self.cache.admitted(result, len(tokens))
        self.hits += result.num_tokens
        self.misses += len(tokens) - result.num_tokens

    def evict(self, num_blocks):
        expected_total = self.evictable_by_model()[0] + len(self.unheld_tails())
        assert self.cache.evictable_blocks == expected_total
        refs, locked = self.model_refs(), self.locked_prefixes()
        seen = len(self.events)
        freed = self.cache.evict(num_blocks)
        removed = [e for e in self.events[seen:] if isinstance(e, BlockRemoved)]
        by_hash = {h: p for p, h in self.hashes.items()}
        gone = [by_hash[h] for e in removed for h in e.block_hashes]
        assert len(removed) == (1 if gone else 0)
        gone_tails = [key for key, b in self.tails.items() if not self.pool.is_cached(b)]
        assert len(gone) + len(gone_tails) == freed
        for key in gone_tails:
            assert refs[self.tails[key]] == 0, "evicted a held tail"
            del self.snapshots[self.tails.pop(key)]
        if gone:
            assert not self.unheld_tails(), "a full block went before an unheld tail"
        for block, (prefix, _) in list(self.live.items()):  # its node is gone: unmatchable
            if any(prefix[: len(p)] == p for p in gone):
                del self.live[block]
        assert freed >= num_blocks or freed == expected_total
        ticks = [self.last_access[p] for p in gone]
        assert ticks == sorted(ticks), "evicted out of LRU order"
        for prefix in gone:
            assert not self.pinned(prefix, refs, locked), "evicted a held or locked block"
            self.uncache(prefix)
        _, leaves = self.evictable_by_model()
        if gone and leaves:
            assert max(ticks) <= min(self.last_access[b[0]] for b in leaves), "not LRU"
        return freed

    def uncache(self, prefix):
        block = self.cached.pop(prefix)
        del self.hashes[prefix], self.last_access[prefix], self.snapshots[block]

    def insert(self, seq):
        full = prefixes(seq.tokens)
        expected = len(self.expected_match(seq.tokens)) * BS
        assert self.cache.insert(seq.tokens, seq.blocks) == expected
        self.clock += 1
        for i, prefix in enumerate(full):
            if prefix not in self.cached:
                parent = self.hashes[prefix[:-BS]] if i else 0
                self.cached[prefix] = seq.blocks[i]
                self.live.pop(seq.blocks[i], None)  # a full tree block now: no longer live
                self.hashes[prefix] = hash_block(parent, prefix[-BS:])
                self.snapshots[seq.blocks[i]] = self.block_kv(seq.blocks[i])
        self.touch(full)

    def make_room(self, num_blocks):
        if not self.pool.can_allocate(num_blocks):
            self.evict(num_blocks - self.pool.num_free)
        return self.pool.can_allocate(num_blocks)

    def pick(self, index):
        return self.seqs[index % len(self.seqs)]

    # ---- rules ----

    def admit_checked(self, tokens):
        """Match, lock, hold the hit, allocate the rest (evicting if needed) or back out."""
        result, lock_prefix = self.match(tokens)
        self.cache.lock(result.node)
        self.pool.incref(result.block_ids)
        seq = Seq(list(tokens), list(result.block_ids), result.node, lock_prefix)
        self.seqs.append(seq)  # before evicting: its lock and hit must be protected
        hit = self.cache.partials.match(tokens, result)
        assert (hit.num_tokens if hit else 0) == self.expected_partial(tokens, result.num_tokens)
        if hit:  # held while making room, like the match
            self.pool.incref([hit.block_id])
            self.seqs.append(source := Seq([], [hit.block_id], None))
        need = self.pool.blocks_for_tokens(len(tokens)) - len(result.block_ids)
        if not self.make_room(need):
            self.drop(seq)
            if hit:
                self.drop(source)
            return None
        start = len(seq.blocks) * BS
        if hit:
            before = self.block_kv(hit.block_id)
            self.seqs.remove(source)
            seq.blocks.append(self.cache.partials.take(hit))
            self.partial_hits += hit.num_tokens
            for got, want in zip(self.block_kv(seq.blocks[-1]), before, strict=True):
                np.testing.assert_array_equal(got, want)
            self.write(seq.blocks[-1], range(hit.num_tokens, min(BS, len(tokens) - start)))
            need -= 1
        for block in self.pool.allocate(need):
            start = len(seq.blocks) * BS
            self.write(block, range(min(BS, len(tokens) - start)))
            seq.blocks.append(block)
        self.admitted(result, tokens)
        return seq

    def drop(self, seq):
        self.forget(seq)
        if seq.node is not None:
            self.cache.unlock(seq.node)
        self.pool.decref(seq.blocks)
        self.seqs.remove(seq)

    @precondition(lambda self: len(self.seqs) < MAX_SEQS)
    @rule(tokens=token_lists)
    def admit(self, tokens):
        self.admit_checked(tokens)

    @precondition(lambda self: len(self.seqs) < MAX_SEQS)
    @rule(tokens=token_lists, tail=st.booleans())
    def whole_request(self, tokens, tail):
        """Admit, run and finish a request in one step: leaves unheld leaves to evict."""
        seq = self.admit_checked(tokens)
        if seq is not None:
            self.insert(seq)
            if tail:
                self.keep_tail(seq)
            self.drop(seq)

    @rule(tokens=token_lists, keep_lock=st.booleans())
    def bare_match(self, tokens, keep_lock):
        result, prefix = self.match(tokens)
        if keep_lock:
            self.cache.lock(result.node)
            self.extra_locks.append((result.node, prefix))

    @precondition(lambda self: self.seqs)
    @rule(index=seq_index)
    def lend(self, index):
        """A running sequence caches its full blocks and offers its partial last block for
        copying (live, uncached), as a prompt's end does in the engine."""
        seq = self.pick(index)
        self.insert(seq)
        full = len(seq.tokens) - len(seq.tokens) % BS
        prefix, tail = tuple(seq.tokens[:full]), tuple(seq.tokens[full:])
        if not tail or not all(p in self.cached for p in prefixes(seq.tokens)):
            return
        block = seq.blocks[full // BS]
        if self.pool.is_cached(block):
            return
        assert self.cache.insert_tail(seq.tokens, seq.blocks, live=True)
        self.clock += 1
        self.touch(prefixes(seq.tokens))
        self.live[block] = (prefix, tail)

    @precondition(lambda self: self.live and len(self.seqs) < MAX_SEQS)
    @rule(index=seq_index, cut=st.integers(1, BS - 1), rest=st.lists(st.integers(0, 3), max_size=4))
    def admit_after_live(self, index, cut, rest):
        """A prompt sharing a running sequence's partial block (the next user of a tenant)."""
        prefix, tail = list(self.live.values())[index % len(self.live)]
        self.admit_checked(list(prefix + tail[:cut]) + rest)

    @precondition(lambda self: self.extra_locks)
    @rule(index=seq_index)
    def bare_unlock(self, index):
        node, _ = self.extra_locks.pop(index % len(self.extra_locks))
        self.cache.unlock(node)

    @precondition(lambda self: self.seqs)
    @rule(index=seq_index)
    def insert_running(self, index):
        self.insert(self.pick(index))

    @precondition(lambda self: self.seqs)
    @rule(index=seq_index, insert_first=st.booleans(), tail=st.booleans())
    def finish(self, index, insert_first, tail):
        seq = self.pick(index)
        if insert_first:
            self.insert(seq)
            if tail:
                self.keep_tail(seq)
        self.drop(seq)

    @precondition(lambda self: self.seqs and len(self.seqs) < MAX_SEQS)
    @rule(index=seq_index)
    def fork(self, index):
        seq = self.pick(index)
        self.pool.incref(seq.blocks)
        self.seqs.append(Seq(list(seq.tokens), list(seq.blocks), None))

    @precondition(lambda self: self.seqs)
    @rule(index=seq_index, new_tokens=st.lists(st.integers(0, 3), min_size=1, max_size=3))
    def append(self, index, new_tokens):
        """Decode: fill the partial last block (copy first if shared), then new blocks."""
        seq = self.pick(index)
        room = len(seq.blocks) * BS - len(seq.tokens)
        copy = room > 0 and self.pool.needs_copy(seq.blocks[-1])
        extra = self.pool.blocks_for_tokens(len(seq.tokens) + len(new_tokens)) - len(seq.blocks)
        if not self.make_room(extra + copy):
            return
        if room:
            self.copy_last(seq)
            self.write(seq.blocks[-1], range(BS - room, BS - room + min(room, len(new_tokens))))
        for i, block in enumerate(self.pool.allocate(extra)):
            seq.blocks.append(block)
            self.write(block, range(min(BS, len(new_tokens) - room - i * BS)))
        seq.tokens += new_tokens

    @precondition(lambda self: any(s.blocks for s in self.seqs))
    @rule(index=seq_index)
    def rewrite_last(self, index):
        """Recompute the last token in place: copy-on-write, then write its slot."""
        seq = self.pick(index)
        if not seq.blocks or not self.make_room(int(self.pool.needs_copy(seq.blocks[-1]))):
            return
        self.copy_last(seq)
        self.write(seq.blocks[-1], [(len(seq.tokens) - 1) % BS])

    def copy_last(self, seq):
        old = seq.blocks[-1]
        expect_copy = self.model_refs()[old] > 1 or old in self.snapshots
        before = self.block_kv(old)
        new = self.pool.copy_on_write(old)
        assert (new != old) == expect_copy
        for got, want in zip(self.block_kv(new), before, strict=True):
            np.testing.assert_array_equal(got, want)
        seq.blocks[-1] = new

    @rule(num_blocks=st.integers(0, 3))
    def evict_rule(self, num_blocks):
        self.evict(num_blocks)

    @rule(now=st.sampled_from([False] * 7 + [True]))  # rarely: it empties the cache
    def reset(self, now):
        if not now:
            return
        if any(self.locked_prefixes()):
            try:
                self.cache.reset()
            except KVCacheError:
                return
            raise AssertionError("reset with locks held must raise")
        self.cache.reset()
        for prefix in list(self.cached):
            self.uncache(prefix)
        for block in self.tails.values():
            del self.snapshots[block]
        self.tails.clear()
        self.live.clear()

    # ---- invariants ----

    @invariant()
    def pool_and_tree_are_sound(self):
        self.cache.check_integrity()

    @invariant()
    def blocks_are_where_the_model_says(self):
        refs = self.model_refs()
        cached_blocks = set(self.cached.values()) | set(self.tails.values())
        for block in range(NUM_BLOCKS):
            assert self.pool.ref_count(block) == refs[block]
            assert self.pool.is_cached(block) == (block in cached_blocks)
        assert self.pool.num_free == NUM_BLOCKS - len(set(refs) | cached_blocks), "leak"

    @invariant()
    def tree_is_the_model(self):
        tree = {p: n.block_ids[i] for n, blocks in self.tree_nodes() for i, p in enumerate(blocks)}
        assert tree == self.cached
        for prefix in self.cached:
            assert len(prefix) == BS or prefix[:-BS] in self.cached, "not prefix-closed"
        for lock in self.locked_prefixes():
            assert all(p in self.cached for p in prefixes(lock)), "locked path evicted"
        for _, blocks in self.tree_nodes():
            assert len({self.last_access[p] for p in blocks}) == 1, "a node mixes ages"

    @invariant()
    def evictable_count_is_exact(self):
        tails = len(self.unheld_tails())
        assert self.cache.evictable_blocks == self.evictable_by_model()[0] + tails
        assert self.cache.cached_blocks == len(self.cached)

    @invariant()
    def tails_are_the_model(self):
        for (prefix, tail), block in self.tails.items():
            assert not prefix or prefix in self.cached, "a tail outlived its prefix"
            node = self.cache.root
            if prefix:
                node = next(n for n, blocks in self.tree_nodes() if blocks[-1] == prefix)
            assert self.cache.partials.tails_of(node).get(tail) == block
        assert len(self.cache.partials) == len(self.tails)
        assert self.cache.partials.hit_tokens == self.partial_hits

    @invariant()
    def counters_match(self):
        assert (self.cache.hit_tokens, self.cache.miss_tokens) == (self.hits, self.misses)

    @invariant()
    def events_replay_to_the_tree(self):
        for event in self.events:
            if isinstance(event, BlockStored):
                assert event.block_hash not in self.replayed
                self.replayed[event.block_hash] = event.token_ids
            elif isinstance(event, BlockRemoved):
                for block_hash in event.block_hashes:
                    del self.replayed[block_hash]
            elif isinstance(event, AllBlocksCleared):
                self.replayed.clear()
        self.events.clear()
        assert self.replayed == {h: p[-BS:] for p, h in self.hashes.items()}

    @invariant()
    def tree_contents_never_change(self):
        for block, (k, v) in self.snapshots.items():
            got_k, got_v = self.block_kv(block)
            np.testing.assert_array_equal(got_k, k)
            np.testing.assert_array_equal(got_v, v)


KVMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestKVStateful = KVMachine.TestCase
