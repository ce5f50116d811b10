"""Prefix index: KV events, optimistic entries with TTL, leading-block matching."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from router.routing.prefix_index import PrefixIndex
from shared.hashing import hash_blocks
from shared.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, BlockWindowsDropped


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
    """As the worker's scheduler cuts a hit (worker/engine/admission.py window_hit): with
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


def test_a_hybrid_model_hit_ends_only_at_a_snapshot_of_its_states():
    """As the worker's scheduler cuts a hit (worker/engine/states.py `cut`): the deepest
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
