"""Prefix index: KV events, optimistic entries with TTL, leading-block matching."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from router.routing.prefix_index import PrefixIndex
from shared.hashing import hash_blocks
from shared.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    BlockWindowsDropped,
    StateSnapshotsDropped,
    StateSnapshotsStored,
)


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def stored(hashes):
    return [BlockStored(h, 0, (), 4) for h in hashes]


def test_match_counts_leading_blocks_only():
    index = PrefixIndex()
    a = hash_blocks(list(range(16)), 4)
    for ev in stored(a[:3]):
        index.apply("w1", ev)
    index.apply("w2", stored([a[1]])[0])  # holds block 1 but not block 0: no leading match
    assert index.match(a, ["w1", "w2", "w3"]) == {"w1": 3, "w2": 0, "w3": 0}


def test_removed_and_cleared_events_drop_entries():
    index = PrefixIndex()
    a = hash_blocks(list(range(16)), 4)
    for ev in stored(a):
        index.apply("w1", ev)
        index.apply("w2", ev)
    index.apply("w1", BlockRemoved((a[2],)))
    index.apply("w2", AllBlocksCleared())
    assert index.match(a, ["w1", "w2"]) == {"w1": 2, "w2": 0}
    assert index.num_blocks("w1") == 3 and index.num_blocks("w2") == 0


def test_optimistic_entries_count_until_they_expire():
    clock = FakeClock()
    index = PrefixIndex(ttl_s=5.0, clock=clock)
    a = hash_blocks(list(range(12)), 4)
    index.add_optimistic("w1", a)
    assert index.match(a, ["w1"]) == {"w1": 3}
    clock.now += 5.0
    assert index.match(a, ["w1"]) == {"w1": 0}
    assert index.purge_expired() == 3 and index.num_optimistic == 0


def test_confirmation_outlives_the_optimistic_entry():
    clock = FakeClock()
    index = PrefixIndex(ttl_s=1.0, clock=clock)
    a = hash_blocks(list(range(8)), 4)
    index.add_optimistic("w1", a)
    for ev in stored(a):
        index.apply("w1", ev)
    clock.now += 2
    assert index.match(a, ["w1"]) == {"w1": 2}


def test_drop_worker_forgets_confirmed_and_optimistic():
    index = PrefixIndex()
    a = hash_blocks(list(range(8)), 4)
    index.add_optimistic("w1", a)
    index.apply("w1", stored(a[:1])[0])
    index.add_optimistic("w2", a)
    index.drop_worker("w1")
    assert index.match(a, ["w1", "w2"]) == {"w1": 0, "w2": 2}


# Model-based check: the index agrees with a plain set-per-worker model under any event mix.
events = st.lists(
    st.tuples(
        st.sampled_from(["w1", "w2", "w3"]),
        st.one_of(
            st.tuples(st.just("store"), st.integers(0, 7)),
            st.tuples(st.just("remove"), st.lists(st.integers(0, 7), max_size=3)),
            st.tuples(st.just("clear"), st.none()),
            st.tuples(st.just("drop"), st.none()),
        ),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(events)
def test_index_matches_a_set_model(ops):
    chain = hash_blocks(list(range(32)), 4)  # 8 chained blocks
    index, model = PrefixIndex(), {"w1": set(), "w2": set(), "w3": set()}
    for worker, (op, arg) in ops:
        if op == "store":
            index.apply(worker, BlockStored(chain[arg], 0, (), 4))
            model[worker].add(chain[arg])
        elif op == "remove":
            index.apply(worker, BlockRemoved(tuple(chain[i] for i in arg)))
            model[worker] -= {chain[i] for i in arg}
        elif op == "clear":
            index.apply(worker, AllBlocksCleared())
            model[worker].clear()
        else:
            index.drop_worker(worker)
            model[worker].clear()
    expected = {}
    for worker, held in model.items():
        expected[worker] = next((i for i, h in enumerate(chain) if h not in held), len(chain))
        assert index.num_blocks(worker) == len(held)
    assert index.match(chain, model) == expected


def test_a_window_model_hit_ends_only_where_the_blocks_before_it_keep_their_windows():
    """As the worker's scheduler cuts a hit (shared/prefix/hit_rule.py, as worker/engine/caches/ CacheCoordinator.hit applies it): with
    k = 2, a block without window K/V may sit inside a match, not among its last two."""
    index = PrefixIndex()
    a = hash_blocks(list(range(32)), 4)  # 8 blocks
    for ev in stored(a[:6]):
        index.apply("w1", ev)
        index.apply("w2", ev)
    index.set_window("w1", 2)
    index.apply("w1", BlockWindowsDropped((a[1], a[4])))
    index.apply("w2", BlockWindowsDropped((a[1], a[4])))  # w2: no window rule registered
    assert index.match(a, ["w1", "w2"]) == {"w1": 4, "w2": 6}  # w1: blocks 2, 3 before 4
    assert index.match(a[:3], ["w1"]) == {"w1": 1}  # block 1 sits before the ends 2 and 3
    index.apply("w1", stored([a[4]])[0])  # computed again: whole
    assert index.match(a, ["w1"]) == {"w1": 6}
    index.apply("w1", BlockRemoved((a[1],)))
    assert index.match(a, ["w1"]) == {"w1": 1}


def test_a_chunked_workers_hit_needs_the_pages_from_its_chunk_start():
    """Chunks of 2 blocks (`Register.chunk_blocks`): a hit ending at a chunk start reads no
    pages; one ending inside a chunk reads that chunk's first block."""
    index = PrefixIndex()
    a = hash_blocks(list(range(24)), 4)  # six blocks
    for ev in stored(a):
        index.apply("w1", ev)
    index.set_window("w1", 0, chunk_blocks=2)
    index.apply("w1", BlockWindowsDropped((a[0], a[1], a[2])))
    assert index.match(a, ["w1"]) == {"w1": 6}  # the end's chunk is blocks 4, 5: whole
    assert index.match(a[:5], ["w1"]) == {"w1": 5}  # 5 reads block 4, whole
    index.apply("w1", BlockWindowsDropped((a[4],)))
    assert index.match(a[:5], ["w1"]) == {"w1": 4}  # 5 reads block 4 (gone): cut to 4
    assert index.match(a[:3], ["w1"]) == {"w1": 2}  # 3 reads block 2 (gone): cut to 2


# ---------------------------------------------------------------- inventories


def inventory(index, worker, held, windowless=(), per_part=3, between=None):
    """Send `held` to `index` as a worker does, in parts; `between(i)` runs after part i."""
    held = list(held)
    chunks = [held[i : i + per_part] for i in range(0, len(held), per_part)] or [[]]
    done = []
    for i, chunk in enumerate(chunks):
        gone = [h for h in chunk if h in windowless]
        done.append(index.receive_inventory(worker, i, len(chunks), chunk, gone))
        if between is not None:
            between(i)
    return done


def test_an_inventory_replaces_what_the_index_knew_of_the_worker():
    index = PrefixIndex()
    a = hash_blocks(list(range(32)), 4)  # 8 blocks
    for ev in stored(a[:2]) + stored([a[7]]):  # stale: the router's view before a restart
        index.apply("w1", ev)
    index.apply("w2", stored([a[0]])[0])
    assert inventory(index, "w1", a[:5]) == [False, True]  # 5 blocks in parts of 3
    assert index.num_blocks("w1") == 5 and index.match(a, ["w1", "w2"]) == {"w1": 5, "w2": 1}
    index.apply("w1", BlockRemoved((a[7],)))  # events go on applying
    assert inventory(index, "w1", []) == [True]  # an empty cache: one empty part
    assert index.num_blocks("w1") == 0 and index.match(a, ["w1", "w2"]) == {"w1": 0, "w2": 1}


def test_an_inventory_is_applied_only_once_every_part_is_in():
    index = PrefixIndex()
    a = hash_blocks(list(range(32)), 4)
    index.apply("w1", stored([a[6]])[0])
    assert not index.receive_inventory("w1", 0, 3, a[:3])
    assert index.num_blocks("w1") == 1  # nothing replaced yet
    assert not index.receive_inventory("w1", 2, 3, a[6:])  # part 1 skipped: dropped
    assert not index.receive_inventory("w1", 1, 3, a[3:6])  # the assembly is gone
    assert index.num_blocks("w1") == 1
    assert not index.receive_inventory("w1", 0, 2, a[:4])  # a new inventory starts over
    index.drop_worker("w1")  # the worker was lost meanwhile: its parts are dropped too
    assert not index.receive_inventory("w1", 1, 2, a[4:])
    assert index.num_blocks("w1") == 0


def test_events_between_the_parts_are_applied_on_top_of_the_snapshot():
    index = PrefixIndex()
    a = hash_blocks(list(range(32)), 4)
    late = {0: BlockRemoved((a[1],)), 1: stored([a[7]])[0]}
    inventory(index, "w1", a[:6], between=lambda i: i in late and index.apply("w1", late[i]))
    assert index.num_blocks("w1") == 6 and index.match(a, ["w1"]) == {"w1": 1}
    assert index.match([a[0], a[1]], ["w1"]) == {"w1": 1}


def test_an_inventory_carries_which_blocks_lost_their_windows():
    index = PrefixIndex()
    a = hash_blocks(list(range(32)), 4)
    index.set_window("w1", 2)
    inventory(index, "w1", a[:6], windowless={a[1], a[4]})
    assert index.match(a, ["w1"]) == {"w1": 4}  # as if BlockWindowsDropped had come
    index.apply("w1", stored([a[4]])[0])  # computed again: whole
    assert index.match(a, ["w1"]) == {"w1": 6}


def test_an_inventory_carries_a_hybrid_workers_state_snapshots():
    index = PrefixIndex()
    a = hash_blocks(list(range(24)), 4)  # six blocks
    index.set_snapshots("w1", True)
    index.apply("w1", StateSnapshotsStored((a[0],)))  # stale: before the router restarted
    assert not index.receive_inventory("w1", 0, 2, a[:3], snapshots=(a[1], a[4]))
    assert index.receive_inventory("w1", 1, 2, a[3:5])
    assert index.match(a, ["w1"]) == {"w1": 5}
    index.apply("w1", StateSnapshotsDropped((a[4],)))
    assert index.match(a, ["w1"]) == {"w1": 2}
    index.apply("w1", StateSnapshotsDropped((a[1],)))
    assert index.match(a, ["w1"]) == {"w1": 0}  # the stale a[0] went with the replace
    inventory(index, "w2", a[:5])  # a worker without the rule: snapshots are no matter
    assert index.match(a, ["w2"]) == {"w2": 5}


def window_usable(chain, held, windowless, need):
    depth = next((i for i, h in enumerate(chain) if h not in held), len(chain))
    for end in range(depth, 0, -1):
        if not windowless.intersection(chain[max(0, end - need) : end]):
            return end
    return 0


# mostly stores, so that a snapshot holds enough blocks to come in several parts
worker_ops = st.lists(
    st.tuples(
        st.sampled_from(["store"] * 5 + ["remove", "remove", "windows", "windows", "clear"]),
        st.integers(0, 7),
    ),
    min_size=8,
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(worker_ops, st.data(), st.integers(1, 3))
def test_an_inventory_raced_by_events_converges(ops, data, per_part):
    """A worker's cache changes (`ops`); the router restarts at some point and gets only
    the events after it; the worker snapshots its cache later. The events after the snapshot,
    arriving anywhere among its parts or after them (or all after them, behind a replay of
    events the snapshot already holds), leave the index equal to the worker's cache."""
    chain = hash_blocks(list(range(32)), 4)
    held, windowless, log = set(), set(), []
    for op, i in ops:
        if op == "store":
            held.add(chain[i]), windowless.discard(chain[i])
            log.append(BlockStored(chain[i], 0, (), 4))
        elif op == "remove":
            held.discard(chain[i]), windowless.discard(chain[i])
            log.append(BlockRemoved((chain[i],)))
        elif op == "windows":
            windowless.update({chain[i]} & held)
            log.append(BlockWindowsDropped((chain[i],)))
        else:
            held.clear(), windowless.clear()
            log.append(AllBlocksCleared())
        log[-1] = (log[-1], frozenset(held), frozenset(windowless))
    cut = data.draw(st.integers(len(log) // 2, len(log) - 1), "snapshot after")
    restart = data.draw(st.integers(0, cut), "router restart before")
    snap_held, snap_windowless = (log[cut - 1][1], log[cut - 1][2]) if cut else (set(), set())
    events = [e for e, _, _ in log]
    index = PrefixIndex()
    index.set_window("w1", 2)
    for ev in events[restart:cut]:  # what reached the new router before the inventory
        index.apply("w1", ev)
    after = events[cut:]
    if data.draw(st.booleans(), "stale events replayed after the inventory"):
        after = events[data.draw(st.integers(restart, cut)) : cut] + after
        slots = [99] * len(after)
    else:
        slots = sorted(
            data.draw(st.lists(st.integers(0, 3), min_size=len(after), max_size=len(after)))
        )
    queue = list(zip(slots, after, strict=True))

    def deliver(upto):
        while queue and queue[0][0] <= upto:
            index.apply("w1", queue.pop(0)[1])

    inventory(index, "w1", sorted(snap_held), snap_windowless, per_part, between=deliver)
    deliver(99)
    assert index.num_blocks("w1") == len(held)
    want = window_usable(chain, held, windowless, 2)
    assert index.match(chain, ["w1"]) == {"w1": want}


def test_a_hybrid_model_hit_ends_only_at_a_snapshot_of_its_states():
    """As the worker's scheduler cuts a hit (worker/engine/caches/states.py `cut`): the deepest
    matched block with a snapshot; a worker without the rule counts every block."""
    from shared.kv_events import StateSnapshotsDropped, StateSnapshotsStored

    index = PrefixIndex()
    a = hash_blocks(list(range(24)), 4)  # six blocks
    for worker in ("hybrid", "plain"):
        for ev in stored(a[:5]):
            index.apply(worker, ev)
    index.set_snapshots("hybrid", True)
    assert index.match(a, ["hybrid", "plain"]) == {"hybrid": 0, "plain": 5}
    index.apply("hybrid", StateSnapshotsStored((a[1], a[3], a[5])))  # a[5]: not held
    assert index.match(a, ["hybrid"]) == {"hybrid": 4}
    index.apply("hybrid", StateSnapshotsDropped((a[3],)))
    assert index.match(a, ["hybrid"]) == {"hybrid": 2}
    index.apply("hybrid", AllBlocksCleared())
    for ev in stored(a[:5]):
        index.apply("hybrid", ev)
    assert index.match(a, ["hybrid"]) == {"hybrid": 0}  # its snapshots went with the cache
