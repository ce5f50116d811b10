"""The hit rule (shared/prefix/hit_rule.py): the deepest end every cache kind can serve."""

from __future__ import annotations

from shared.prefix import HitRule


def test_full_attention_serves_the_whole_match():
    assert HitRule().usable(7) == 7


def test_windows_need_their_pages_just_before_the_end():
    gone = {2}.__contains__  # block 2 lost its window pages
    rule = HitRule(window_blocks=2)
    assert rule.usable(8, window_gone=gone) == 8  # blocks 6, 7 before the end are whole
    assert rule.usable(4, window_gone=gone) == 2  # ends 4 and 3 read block 2
    assert HitRule(window_blocks=1).usable(3, window_gone=gone) == 2


def test_snapshots_end_a_hybrid_hit():
    rule = HitRule(snapshots=True)
    assert rule.usable(6, snapshot_after={1, 3}.__contains__) == 4
    assert rule.usable(6, snapshot_after=set().__contains__) == 0


def test_both_kinds_at_once_take_the_deepest_end_both_serve():
    """A cut for snapshots first, then for windows, could end where no snapshot is: the rule
    asks both about every candidate end."""
    rule = HitRule(window_blocks=2, snapshots=True)
    snapshots = {3, 5}.__contains__  # after blocks 3 and 5: ends 4 and 6
    assert rule.usable(6, window_gone={4}.__contains__, snapshot_after=snapshots) == 4
    assert rule.usable(6, window_gone={2}.__contains__, snapshot_after=snapshots) == 6
    assert rule.usable(6, window_gone={3, 5}.__contains__, snapshot_after=snapshots) == 0
