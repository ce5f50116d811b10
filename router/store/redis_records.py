"""Files, batches and a batch's progress in the fleet's shared Redis (`state_url`): every
router sees every file and batch, and whichever router holds a batch's lease runs it (another
takes it over when the lease runs out: its holder died).

A kind is one hash (key -> JSON); a file's content is one string key. Each call is one round
trip, awaited on the event loop.
"""

from __future__ import annotations

import json

import redis.asyncio as redis

from router.store.redis_client import PREFIX, reachable

KIND = f"{PREFIX}records:"  # + kind
BLOB = f"{PREFIX}blob:"  # + key
LEASE = f"{PREFIX}lease:"  # + name
CLAIM = """
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""


class RedisRecords:
    def __init__(self, client: redis.Redis):
        self._client = client
        self._claim = client.register_script(CLAIM)

    async def put(self, kind: str, key: str, value: dict) -> None:
        with reachable("writing a batch record"):
            await self._client.hset(KIND + kind, key, json.dumps(value))

    async def get(self, kind: str, key: str) -> dict | None:
        with reachable("reading a batch record"):
            found = await self._client.hget(KIND + kind, key)
        return json.loads(found) if found is not None else None

    async def values(self, kind: str) -> list[dict]:
        with reachable("listing batch records"):
            found = await self._client.hvals(KIND + kind)
        return [json.loads(v) for v in found]

    async def count(self, kind: str) -> int:
        with reachable("counting batch records"):
            return await self._client.hlen(KIND + kind)

    async def delete(self, kind: str, key: str) -> bool:
        with reachable("deleting a batch record"):
            return await self._client.hdel(KIND + kind, key) > 0

    async def drop(self, kind: str) -> None:
        with reachable("deleting batch records"):
            await self._client.delete(KIND + kind)

    async def put_blob(self, key: str, data: bytes) -> None:
        with reachable("storing a file"):
            await self._client.set(BLOB + key, data)

    async def get_blob(self, key: str) -> bytes | None:
        with reachable("reading a file"):
            return await self._client.get(BLOB + key)

    async def delete_blob(self, key: str) -> None:
        with reachable("deleting a file"):
            await self._client.delete(BLOB + key)

    async def claim(self, name: str, holder: str, ttl_s: float) -> bool:
        with reachable("claiming a batch"):
            return bool(await self._claim(keys=[LEASE + name], args=[holder, int(ttl_s * 1000)]))

    async def close(self) -> None:
        pass  # the client is the router's (router/store/__init__.py closes it)
