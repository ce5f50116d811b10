"""The placement lease and what the routers say about placement, in the fleet's shared Redis
(`state_url`; router/placement/leadership.py says what each router does with it).

Every key is under `placement:vN:` (router/placement/shared.py `VERSION`).

- `placement:leader`: the leading router's id, with a time to live (`placement_lease_s`).
  Each turn (a second) every router runs one script: the holder renews it; when no router
  holds it (its holder stopped, or died and the lease ran out), the caller takes it.
- `placement:state`: the leader's state (JSON), rewritten each turn; it expires after a few
  leases unwritten, so a fleet started again later begins from its config.
- `placement:demand`: a hash, router id -> that follower's demand (JSON, with the wall time
  it was written); the leader reads them all and deletes those older than a lease.
- `placement:orders`: a list of the operator's load, unload and pin asked of followers (JSON);
  the leader takes them all each turn (read and deleted in one script).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

import redis.asyncio as redis
from redis.exceptions import RedisError

from router.placement.leadership import Pulled
from router.placement.shared import VERSION
from router.store.redis_client import PREFIX, reachable

PLACEMENT = f"{PREFIX}placement:v{VERSION}:"  # routers of another version: keys of their own
LEADER = f"{PLACEMENT}leader"
STATE = f"{PLACEMENT}state"
DEMAND = f"{PLACEMENT}demand"
ORDERS = f"{PLACEMENT}orders"
log = logging.getLogger(__name__)
STATE_LEASES = 3  # the leader's state outlives its last write by this many leases
# KEYS[1]: the lease. ARGV: this router's id, the lease in ms. Returns the holder after it.
CLAIM = """
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return holder end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return ARGV[1]
"""
TAKE_ALL = """
local all = redis.call('LRANGE', KEYS[1], 0, -1)
redis.call('DEL', KEYS[1])
return all
"""
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class RedisLeadership:
    def __init__(
        self,
        client: redis.Redis,
        router_id: str,
        lease_s: float,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ):
        self.router_id, self.lease_s = router_id, lease_s
        self._client, self._clock, self._wall = client, clock, wall
        self._claim = client.register_script(CLAIM)
        self._release = client.register_script(RELEASE)
        self._take_all = client.register_script(TAKE_ALL)
        self._until = float("-inf")  # this router leads until then (monotonic), by its lease
        self._leader: str | None = None

    @property
    def leading(self) -> bool:
        return self._clock() < self._until

    @property
    def leader(self) -> str | None:
        return self.router_id if self.leading else self._leader

    async def pull(self) -> Pulled:
        was_leading, asked = self.leading, self._clock()
        with reachable("renewing the placement lease"):
            holder = await self._claim(
                keys=[LEADER], args=[self.router_id, int(self.lease_s * 1000)]
            )
        self._leader = holder.decode()
        # counted from before the call: the lease may have started any time after it
        self._until = asked + self.lease_s if self._leader == self.router_id else float("-inf")
        if not self.leading:
            return Pulled(state=await self._state())
        state = None if was_leading else await self._state()  # taking over: start from it
        return Pulled(state, await self._demands(), await self._orders())

    async def _orders(self) -> list[dict]:
        with reachable("taking the operator's orders"):
            found = await self._take_all(keys=[ORDERS])
        return [json.loads(raw) for raw in found]

    async def _state(self) -> dict | None:
        with reachable("reading the placement state"):
            found = await self._client.get(STATE)
        return json.loads(found) if found is not None else None

    async def _demands(self) -> list[dict]:
        with reachable("reading the routers' demand"):
            found = await self._client.hgetall(DEMAND)
        fresh, stale, oldest = [], [], self._wall() - self.lease_s
        for router_id, raw in found.items():
            demand = json.loads(raw)
            if router_id.decode() == self.router_id:
                continue  # its own, from when it followed
            (fresh if demand.get("at", 0.0) >= oldest else stale).append((router_id, demand))
        if stale:  # routers gone: their requests wait no more
            with reachable("pruning the routers' demand"):
                await self._client.hdel(DEMAND, *(router_id for router_id, _ in stale))
        return [demand for _, demand in fresh]

    async def publish_state(self, state: dict) -> None:
        if not self.leading:  # the lease ran out meanwhile: the next leader writes it
            return
        ttl_ms = int(self.lease_s * STATE_LEASES * 1000)
        with reachable("publishing the placement state"):
            await self._client.set(STATE, json.dumps(state), px=ttl_ms)

    async def publish_demand(self, demand: dict) -> None:
        ttl_ms = int(self.lease_s * STATE_LEASES * 1000)
        with reachable("publishing this router's demand"):
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.hset(DEMAND, self.router_id, json.dumps(demand))
                pipe.pexpire(DEMAND, ttl_ms)
                await pipe.execute()

    async def send_orders(self, orders: list[dict]) -> None:
        ttl_ms = int(self.lease_s * STATE_LEASES * 1000)  # a fleet with no leader that long
        with reachable("forwarding the operator's orders"):
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.rpush(ORDERS, *(json.dumps(order) for order in orders))
                pipe.pexpire(ORDERS, ttl_ms)
                await pipe.execute()

    async def release(self) -> None:
        if not self.leading:
            return
        self._until = float("-inf")
        try:
            await self._release(keys=[LEADER], args=[self.router_id])
        except RedisError as e:  # stopping anyway: the lease runs out by itself
            log.warning("could not hand the placement lease over: %s", e)
