"""The KV tier on disk: eviction -> disk -> hit, restart -> hit, bad files ignored, bounded."""

from __future__ import annotations

import numpy as np
import pytest

from shared.kv_events import BlockRemoved, BlockStored
from shared.sampling import SamplingParams
from tests.support.engine_fixtures import (
    make_engine,
    reference_greedy,
    run_to_completion,
    tiny_model,
)
from worker.kv.disk_store import BlockLayout, DiskKVStore

LAYOUT = BlockLayout(num_layers=2, block_size=4, num_kv_heads=2, head_dim=3, dtype="float32")


def payload(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(LAYOUT.shape).astype(np.float32)


def store(tmp_path, capacity=1 << 20, fingerprint="fp1") -> DiskKVStore:
    return DiskKVStore(tmp_path, fingerprint, LAYOUT, capacity)


def test_round_trip_and_token_check(tmp_path):
    s = store(tmp_path)
    s.put(11, 0, (1, 2, 3, 4), payload(1))
    s.flush()
    assert 11 in s and s.used_bytes > LAYOUT.nbytes
    np.testing.assert_array_equal(s.get(11, (1, 2, 3, 4)), payload(1))
    assert s.get(12, (1, 2, 3, 4)) is None
    assert s.get(11, (9, 9, 9, 9)) is None  # another prompt's tokens: rejected and deleted
    assert 11 not in s and not list(s.dir.glob("*.kv"))


def test_capacity_drops_least_recently_used(tmp_path):
    probe = store(tmp_path / "probe")
    probe.put(1, 0, (1,) * 4, payload(1))
    probe.flush()
    one = probe.used_bytes  # one file: payload + header
    s = store(tmp_path, capacity=3 * one + one // 2)
    for h in range(1, 4):
        s.put(h, 0, (h,) * 4, payload(h))
    s.flush()
    assert abs(s.used_bytes - 3 * one) < 30  # header sizes differ by a few digits
    s.get(1, (1,) * 4)  # 1 is now the most recently used
    s.put(4, 0, (4,) * 4, payload(4))
    s.flush()
    assert s.used_bytes <= 3 * one + one // 2
    assert 2 not in s and all(h in s for h in (1, 3, 4))
    assert s.drain_removed() == [2] and s.drain_removed() == []


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage", "foreign"])
def test_damaged_or_foreign_files_are_ignored_at_read_and_at_scan(tmp_path, damage):
    s = store(tmp_path)
    s.put(7, 0, (1, 2, 3, 4), payload(7))
    s.put(8, 7, (5, 6, 7, 8), payload(8))
    s.flush()
    path = s.dir / f"{7:016x}.kv"
    raw = path.read_bytes()
    if damage == "flip":
        path.write_bytes(raw[:-10] + bytes([raw[-10] ^ 0xFF]) + raw[-9:])
    elif damage == "truncate":
        path.write_bytes(raw[: len(raw) // 2])
    elif damage == "garbage":
        path.write_bytes(b"\x00" * 64)
    else:  # written by a worker of another model
        other = store(tmp_path / "other", fingerprint="fp2")
        other.put(7, 0, (1, 2, 3, 4), payload(7))
        other.flush()
        path.write_bytes((other.dir / f"{7:016x}.kv").read_bytes())
    assert s.get(7, (1, 2, 3, 4)) is None and not path.exists()
    path.write_bytes(raw[: len(raw) // 3])  # and a restart finds a bad file again
    (s.dir / "junk.tmp").write_bytes(b"half a write")
    again = store(tmp_path)
    assert again.scan() == 1 and 8 in again and 7 not in again
    assert not path.exists() and not (s.dir / "junk.tmp").exists()
    np.testing.assert_array_equal(again.get(8, (5, 6, 7, 8)), payload(8))


def test_blocks_are_listed_parents_first(tmp_path):
    s = store(tmp_path)
    s.put(3, 2, (3,) * 4, payload(3))
    s.put(2, 1, (2,) * 4, payload(2))
    s.put(1, 0, (1,) * 4, payload(1))
    s.flush()
    assert [b.block_hash for b in s.blocks()] == [1, 2, 3]


# ---- the engine with a disk tier -------------------------------------------------------------

PROMPT = [(7 * i + 3) % 97 for i in range(70)]  # 8 full blocks of 8 and a tail
GREEDY = SamplingParams(max_tokens=5)


def disk_engine(model, tmp_path, **overrides):
    config = dict(num_blocks=24, kv_disk_bytes=64 << 20, kv_disk_dir=str(tmp_path))
    return make_engine(model, **(config | overrides))


def evict_everything(engine) -> None:
    """Fill the small pool with other prompts, so every cached block of PROMPT goes."""
    for i in range(3):
        engine.add_request(f"other{i}", [(11 * j + i) % 97 for j in range(120)], GREEDY)
        run_to_completion(engine)


def test_evicted_prefix_comes_back_from_disk_with_identical_output(tmp_path):
    model = tiny_model("llama")
    engine = disk_engine(model, tmp_path)
    expected = reference_greedy(model, PROMPT, 5)
    engine.add_request("a", PROMPT, GREEDY)
    assert run_to_completion(engine)["a"] == expected
    evict_everything(engine)
    engine.disk.store.flush()
    assert engine.cache.peek_prefix_length(PROMPT) == 0  # not in memory any more
    events = engine.drain_kv_events()
    removed = {h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes}
    assert not removed & {b.block_hash for b in engine.disk.store.blocks()}  # still ours

    engine.add_request("a2", PROMPT, GREEDY)
    deltas = []
    while engine.has_work():
        deltas += engine.step()
    assert [t for d in deltas for t in d.token_ids] == expected
    assert deltas[-1].usage.cached_tokens == 64  # 8 blocks from disk
    assert engine.stats()["disk_hit_tokens"] == 64
    engine.check_integrity()


def test_restarted_worker_announces_its_disk_blocks_and_hits_them(tmp_path):
    model = tiny_model("qwen2")
    first = disk_engine(model, tmp_path)
    first.add_request("a", PROMPT, GREEDY)
    run_to_completion(first)
    evict_everything(first)
    first.disk.store.close()

    second = disk_engine(model, tmp_path)  # same model, same folder: a restart
    announced = [e for e in second.drain_kv_events() if isinstance(e, BlockStored)]
    assert len(announced) >= 8
    second.add_request("a", PROMPT, GREEDY)
    assert run_to_completion(second)["a"] == reference_greedy(model, PROMPT, 5)
    assert second.stats()["disk_hit_tokens"] == 64

    other = disk_engine(tiny_model("qwen2", seed=1), tmp_path)  # other weights: other files
    assert other.stats()["disk_blocks"] == 0


def test_disk_stays_within_its_bound(tmp_path):
    model = tiny_model("llama")
    engine = disk_engine(model, tmp_path, kv_disk_bytes=6 * (2 * 2 * 8 * 2 * 8 * 4 + 600))
    for i in range(6):
        engine.add_request(f"r{i}", [(13 * j + i) % 97 for j in range(90)], GREEDY)
        run_to_completion(engine)
    engine.disk.store.flush()
    assert 0 < engine.disk.store.used_bytes <= engine.config.kv_disk_bytes
    dropped = [e for e in engine.drain_kv_events() if isinstance(e, BlockRemoved)]
    assert dropped  # what left the disk is announced as removed
