"""Each API key's budget windows in the fleet's shared Redis (`state_url`): every router charges
and reads one window per key, so a key's requests per minute hold across the fleet.

A window is a sorted set of events scored by wall-clock time (member "SEQ:AMOUNT", SEQ from one
counter so every event is distinct), expiring a minute after its last write. Each call is one
Lua script, so trimming, checking and charging are one atomic step across routers.
"""

from __future__ import annotations

import redis.asyncio as redis

from router.store.redis_client import PREFIX, reachable
from router.store.windows import WINDOW_S, Admission, Events, Spent

SEQUENCE = f"{PREFIX}budget:sequence"

# KEYS: requests window, tokens window, sequence. ARGV: now, window seconds, then per script.
PRELUDE = """
local now, window = tonumber(ARGV[1]), tonumber(ARGV[2])
local function events(key)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
  return redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
end
local function total(list)
  local sum = 0
  for i = 1, #list, 2 do sum = sum + tonumber(string.match(list[i], ':(%d+)$')) end
  return sum
end
local function add(key, amount)
  redis.call('ZADD', key, now, redis.call('INCR', KEYS[3]) .. ':' .. amount)
  redis.call('PEXPIRE', key, math.ceil(window * 1000))
end
"""
# ARGV[3], ARGV[4]: the requests and tokens limits (-1: none)
ADMIT = (
    PRELUDE
    + """
local requests, tokens = events(KEYS[1]), events(KEYS[2])
local rpm, tpm = tonumber(ARGV[3]), tonumber(ARGV[4])
if (rpm < 0 or total(requests) < rpm) and (tpm < 0 or total(tokens) < tpm) then
  add(KEYS[1], 1)
  return {1, events(KEYS[1]), tokens}
end
return {0, requests, tokens}
"""
)
ADD = PRELUDE + "add(KEYS[2], tonumber(ARGV[3]))\nreturn 1\n"  # ARGV[3]: tokens
SPENT = PRELUDE + "return {0, events(KEYS[1]), events(KEYS[2])}\n"


class RedisLedger:
    def __init__(self, client: redis.Redis):
        self._admit = client.register_script(ADMIT)
        self._add = client.register_script(ADD)
        self._spent = client.register_script(SPENT)

    async def admit(self, key_id: str, now: float, rpm: int | None, tpm: int | None) -> Admission:
        limits = [-1 if rpm is None else rpm, -1 if tpm is None else tpm]
        with reachable("checking a key's budget"):
            admitted, requests, tokens = await self._admit(
                keys=_keys(key_id), args=[now, WINDOW_S, *limits]
            )
        return Admission(bool(admitted), Spent(_events(requests), _events(tokens)))

    async def add_tokens(self, key_id: str, now: float, tokens: int) -> None:
        if tokens > 0:
            with reachable("charging a key's tokens"):
                await self._add(keys=_keys(key_id), args=[now, WINDOW_S, tokens])

    async def spent(self, key_id: str, now: float) -> Spent:
        with reachable("reading a key's budget"):
            _, requests, tokens = await self._spent(keys=_keys(key_id), args=[now, WINDOW_S])
        return Spent(_events(requests), _events(tokens))


def _keys(key_id: str) -> list[str]:
    window = f"{PREFIX}budget:{key_id}"
    return [f"{window}:requests", f"{window}:tokens", SEQUENCE]


def _events(flat: list) -> Events:
    """ZRANGE ... WITHSCORES as Lua returns it: member, score, member, score..."""
    pairs = zip(flat[::2], flat[1::2], strict=True)
    return tuple((float(score), int(member.rsplit(b":", 1)[1])) for member, score in pairs)
