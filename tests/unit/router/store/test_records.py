"""The Batch API's records (files, batches, progress) behave alike in every backend: SQLite,
memory and the shared Redis; a lease is held by one holder at a time."""

from __future__ import annotations

import asyncio

import pytest

from router.store.records import MemoryRecords, SqliteRecords


@pytest.fixture(params=["memory", "sqlite", "redis"])
async def records(request, tmp_path):
    if request.param == "memory":
        store = MemoryRecords()
    elif request.param == "sqlite":
        store = SqliteRecords(tmp_path / "batches.sqlite3")
    else:
        from router.store.redis_client import connect
        from router.store.redis_records import RedisRecords

        client = connect(request.getfixturevalue("redis_url"))
        store = RedisRecords(client)
    yield store
    await store.close()
    if request.param == "redis":
        await client.aclose()


async def test_records_blobs_and_kinds(records):
    await records.put("batch", "b1", {"id": "b1", "n": 1})
    await records.put("batch", "b1", {"id": "b1", "n": 2})  # replaced
    await records.put("batch", "b2", {"id": "b2"})
    await records.put("lines:b1", "0", {"index": 0})
    assert await records.get("batch", "b1") == {"id": "b1", "n": 2}
    assert await records.get("batch", "nope") is None
    assert sorted(r["id"] for r in await records.values("batch")) == ["b1", "b2"]
    assert await records.count("batch") == 2 and await records.count("lines:b1") == 1
    assert await records.delete("batch", "b2") and not await records.delete("batch", "b2")
    await records.drop("lines:b1")
    assert await records.values("lines:b1") == [] and await records.count("batch") == 1
    await records.put_blob("file-1", b"\x00line\n")
    assert await records.get_blob("file-1") == b"\x00line\n"
    await records.delete_blob("file-1")
    assert await records.get_blob("file-1") is None


async def test_a_lease_has_one_holder_until_it_runs_out(records):
    assert await records.claim("batch_1", "router-a", 30)
    assert await records.claim("batch_1", "router-a", 30)  # renewed
    assert not await records.claim("batch_1", "router-b", 30)
    assert await records.claim("batch_2", "router-b", 30)
    assert await records.claim("batch_3", "router-a", 0.001)
    await asyncio.sleep(0.01)
    assert await records.claim("batch_3", "router-b", 30)  # its holder let it run out
