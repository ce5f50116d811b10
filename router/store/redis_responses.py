"""The stored replies in the fleet's shared Redis (`state_url`): every router serving the fleet
sees every conversation, so a client may continue on any of them.

Each entry is one string key (its encoded JSON, expiring with the age limit); a sorted set
orders the ids by when they were stored, a hash holds each one's size and a counter their
total, so one Lua script keeps, expires and bounds atomically however many routers write.
Each call is one round trip, awaited on the event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import redis.asyncio as redis

from router.api.responses.store import StoredResponse
from router.store.codec import decode, encode
from router.store.redis_client import PREFIX, reachable

ORDER, SIZES, TOTAL = (f"{PREFIX}responses:{name}" for name in ("order", "sizes", "bytes"))
ENTRY = f"{PREFIX}response:"  # + the response id

# KEYS: order, sizes, total. ARGV: entry prefix, then (drop) ids / (keep) id, body, now, ttl,
# max count, max bytes. The total is a cache of the sizes' sum: when it drifts (it says more
# than the entries hold), keeping an entry counts it again instead of failing for good.
DROP = """
local function drop(id)
  local size = tonumber(redis.call('HGET', KEYS[2], id) or '0')
  redis.call('DEL', ARGV[1] .. id)
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
  redis.call('DECRBY', KEYS[3], size)
end
"""
KEEP = (
    DROP
    + """
local id, body, now, ttl = ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local max_count, max_bytes = tonumber(ARGV[6]), tonumber(ARGV[7])
drop(id)
for _, old in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - ttl))) do
  drop(old)
end
if #body > max_bytes or max_count == 0 then return 0 end
redis.call('SET', ARGV[1] .. id, body, 'PX', math.ceil(ttl * 1000))
redis.call('ZADD', KEYS[1], now, id)
redis.call('HSET', KEYS[2], id, #body)
redis.call('INCRBY', KEYS[3], #body)
while redis.call('ZCARD', KEYS[1]) > max_count
    or tonumber(redis.call('GET', KEYS[3]) or '0') > max_bytes do
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
  if oldest == id then
    -- only the new entry is left, yet the total is over: it drifted (a key lost to an
    -- eviction or a FLUSH, a write from an older router). Count it again from the sizes.
    local total = 0
    for _, size in ipairs(redis.call('HVALS', KEYS[2])) do total = total + tonumber(size) end
    redis.call('SET', KEYS[3], total)
    if total > max_bytes then drop(id) return 0 end
    break
  end
  drop(oldest)
end
return 1
"""
)
FORGET = DROP + "drop(ARGV[2])\nreturn 1\n"


class RedisResponses:
    def __init__(
        self,
        client: redis.Redis,
        size: int,
        max_bytes: int,
        ttl_s: float,
        clock: Callable[[], float] = time.time,
    ):
        self._client = client
        self._size, self._max_bytes, self._ttl_s = size, max_bytes, ttl_s
        self.clock = clock  # wall clock: the routers' clocks agree (NTP), monotonic ones don't
        self._keep = client.register_script(KEEP)
        self._forget = client.register_script(FORGET)

    async def get(self, response_id: str, owner: str | None) -> StoredResponse | None:
        with reachable("reading a stored response"):
            body = await self._client.get(ENTRY + response_id)
        if body is None:
            return None
        entry = decode(body)
        live = entry.stored_at >= self.clock() - self._ttl_s
        return entry if live and entry.owner == owner else None

    async def put(self, entry: StoredResponse) -> None:
        now = self.clock()
        body = encode(replace(entry, stored_at=now))
        args = [ENTRY, entry.id, body, now, self._ttl_s, self._size, self._max_bytes]
        with reachable("storing a response"):
            await self._keep(keys=[ORDER, SIZES, TOTAL], args=args)

    async def delete(self, response_id: str, owner: str | None) -> bool:
        if await self.get(response_id, owner) is None:
            return False
        with reachable("deleting a stored response"):
            await self._forget(keys=[ORDER, SIZES, TOTAL], args=[ENTRY, response_id])
        return True

    async def count(self) -> int:
        with reachable("counting stored responses"):
            return await self._client.zcount(ORDER, f"({self.clock() - self._ttl_s}", "+inf")

    async def total_bytes(self) -> int:
        with reachable("sizing stored responses"):
            return int(await self._client.get(TOTAL) or 0)

    async def close(self) -> None:
        pass  # the client is the router's (router/store/__init__.py closes it)
