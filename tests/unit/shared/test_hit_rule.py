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


def test_chunks_need_the_pages_from_their_end_chunk_start():
    """Chunks of 3 blocks: a hit ending at 7 reads blocks 6 (its chunk's start) on; one
    ending a chunk (6) reads none, however many pages are gone before it."""
    rule = HitRule(chunk_blocks=3)
    assert [rule.pages_from(end) for end in (6, 7, 8)] == [6, 6, 6]
    assert rule.usable(8, window_gone={5}.__contains__) == 8  # 5 is in the chunk before
    assert rule.usable(8, window_gone={6}.__contains__) == 6  # 8 and 7 read 6; 6 reads none
    assert rule.usable(6, window_gone=range(6).__contains__) == 6
    assert rule.usable(2, window_gone={0}.__contains__) == 0


def test_windows_and_chunks_sharing_pages_need_both_spans():
    """Both kinds' layers in one page per block: a hit reads the pages from the earlier of its
    window's and its chunk's starts."""
    rule = HitRule(window_blocks=2, chunk_blocks=4)
    assert [rule.pages_from(end) for end in (4, 5, 6, 7)] == [2, 3, 4, 4]
    assert rule.usable(5, window_gone={3}.__contains__) == 3  # 5 and 4 (its window) read it
    assert rule.usable(5, window_gone={2}.__contains__) == 5
