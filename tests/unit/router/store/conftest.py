"""Every store of stored replies, built with a clock the tests move (tests/support/redis_server.py
starts the real redis-server the Redis one needs)."""

from __future__ import annotations

import pytest

from router.store.memory import MemoryResponses
from router.store.redis_client import connect
from router.store.redis_responses import RedisResponses
from router.store.sqlite import SqliteResponses


class Clock:
    def __init__(self, now: float = 1_764_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=["memory", "sqlite", "redis"])
async def make_store(request, tmp_path, clock):
    """make(size, max_bytes, ttl_s) -> a store of the parametrized kind; closed at the end."""
    opened, clients = [], []

    async def make(size: int = 100, max_bytes: int = 2**20, ttl_s: float = 3600.0):
        bounds = (size, max_bytes, ttl_s)
        if request.param == "memory":
            store = MemoryResponses(*bounds, clock=clock)
        elif request.param == "sqlite":
            store = SqliteResponses(tmp_path / "responses.sqlite3", *bounds, clock=clock)
        else:
            clients.append(connect(request.getfixturevalue("redis_url")))
            store = RedisResponses(clients[-1], *bounds, clock=clock)
        opened.append(store)
        return store

    yield make
    for store in opened:
        await store.close()
    for client in clients:
        await client.aclose()
