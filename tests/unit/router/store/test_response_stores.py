"""Every store of stored replies (memory, SQLite, Redis) keeps the same promises: an entry reads
back whole, only to the key that stored it; the oldest go first past the count and byte bounds;
entries expire with age; a delete is the owner's alone."""

from __future__ import annotations

from router.api.responses.store import StoredResponse
from router.store.codec import encode


def entry(i: int, owner: str | None = None, text: str = "ok") -> StoredResponse:
    item = {"type": "message", "id": f"msg_{i}", "content": [{"type": "output_text", "text": text}]}
    response = {"id": f"resp_{i}", "object": "response", "output": [item]}
    user = {"type": "message", "id": f"in_{i}", "role": "user", "content": "hi"}
    return StoredResponse(response, (user,), (user, item), cache_key=f"conv-{i}", owner=owner)


async def test_an_entry_reads_back_whole(make_store, clock):
    store = await make_store()
    await store.put(entry(1, text="héllo ✓"))
    got = await store.get("resp_1", None)
    assert got == StoredResponse(**{**entry(1, text="héllo ✓").__dict__, "stored_at": clock.now})
    assert await store.get("resp_2", None) is None and await store.count() == 1


async def test_only_its_owner_sees_an_entry(make_store):
    store = await make_store()
    await store.put(entry(1, owner="key-a"))
    await store.put(entry(2))  # keys off: nobody's
    assert (await store.get("resp_1", "key-a")).owner == "key-a"
    for reader in ("key-b", None):
        assert await store.get("resp_1", reader) is None
    assert await store.get("resp_2", "key-a") is None
    assert not await store.delete("resp_1", "key-b")  # another key's delete does nothing
    assert await store.get("resp_1", "key-a") is not None
    assert await store.delete("resp_1", "key-a") and await store.get("resp_1", "key-a") is None
    assert not await store.delete("resp_1", "key-a")


async def test_the_count_bound_drops_the_oldest(make_store, clock):
    store = await make_store(size=3)
    for i in range(5):
        clock.now += 1
        await store.put(entry(i))
    assert await store.count() == 3
    assert [await store.get(f"resp_{i}", None) is not None for i in range(5)] == [
        False,
        False,
        True,
        True,
        True,
    ]
    await store.put(entry(2, text="again"))  # storing an id again replaces it, newest now
    await store.put(entry(9))
    assert await store.get("resp_3", None) is None
    assert (await store.get("resp_2", None)).response["output"][0]["content"][0]["text"] == "again"


async def test_the_byte_bound_holds(make_store, clock):
    one = len(encode(entry(0, text="x" * 1000)))  # every entry below is about this big
    store = await make_store(max_bytes=3 * one + one // 2)
    for i in range(6):
        clock.now += 1
        await store.put(entry(i, text="x" * 1000))
        assert await store.total_bytes() <= 3 * one + one // 2
    assert await store.count() == 3 and await store.get("resp_5", None) is not None
    await store.put(entry(7, text="y" * 5000))  # bigger than the whole bound: not kept
    assert await store.get("resp_7", None) is None and await store.count() == 3


async def test_entries_expire_with_age(make_store, clock):
    store = await make_store(ttl_s=10.0)
    await store.put(entry(1))
    clock.now += 5
    await store.put(entry(2))
    clock.now += 5.5  # resp_1 is 10.5 s old, resp_2 5.5 s
    assert await store.get("resp_1", None) is None and await store.get("resp_2", None) is not None
    assert await store.count() == 1
    assert not await store.delete("resp_1", None)  # an expired entry is gone for every call
    clock.now += 5
    assert await store.count() == 0


async def test_a_size_of_zero_keeps_nothing(make_store):
    store = await make_store(size=0)
    await store.put(entry(1))
    assert await store.get("resp_1", None) is None and await store.count() == 0


async def test_the_redis_byte_total_heals_when_it_drifts(redis_url, clock):
    """The total is a cache of the sizes' sum: a lost key (an eviction, a FLUSH of some keys)
    left it over the bound with nothing stored, and every later write failed in the script."""
    from router.store.redis_client import connect
    from router.store.redis_responses import ORDER, TOTAL, RedisResponses

    client = connect(redis_url)
    try:
        store = RedisResponses(client, 100, 10_000, 3600.0, clock=clock)
        await store.put(entry(1))
        await client.delete(ORDER)  # the order set lost; the total still counts resp_1
        await client.set(TOTAL, 10**9)  # and far over the bound
        for i in (2, 3):
            clock.now += 1
            await store.put(entry(i))
            assert await store.get(f"resp_{i}", None) is not None
        assert await store.count() == 2
        assert 0 < await store.total_bytes() <= 10_000
    finally:
        await client.flushdb()
        await client.aclose()
