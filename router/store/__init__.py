"""Where the router keeps what outlives one request: the stored /v1/responses replies, each
API key's budget windows (router/http/budgets.py), and the Batch API's files, batches and
their progress (router/store/records.py, redis_records.py: they follow the responses' store).

A router alone keeps them itself: replies in a SQLite file by default (router/store/sqlite.py,
one per router), or in memory; budgets in memory. With `state_url`, both live in the fleet's
shared Redis, so every router serving the fleet sees the same conversations and charges the
same budgets, and the routers lead placement one at a time under a lease there
(router/store/redis_placement.py; a router alone leads itself). `open_state` is the one
front; nothing else picks a backend.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from router.placement.leadership import Leadership, SoleLeader
from router.store.memory import MemoryResponses
from router.store.paths import default_store_path
from router.store.records import MemoryRecords, SqliteRecords, records_path
from router.store.windows import Ledger, MemoryLedger
from shared.config.fields import ConfigError

if TYPE_CHECKING:
    from router.api.batch.objects import Records
    from router.api.responses.store import ResponseStore
    from router.config import RouterConfig
    from shared.config.sections import RouterSection

log = logging.getLogger(__name__)


@dataclass
class RouterState:
    responses: ResponseStore
    ledger: Ledger
    where: str  # for the startup log: "sqlite /path", "memory", "redis://..."
    client: Any = None  # the shared Redis client, when there is one
    # files, batches and their progress (router/api/batch/): beside the responses, the same way
    records: Records = field(default_factory=MemoryRecords)
    # who places (router/placement/leadership.py): this router alone, or the lease's holder
    leadership: Leadership = field(default_factory=SoleLeader)

    async def close(self) -> None:
        await self.leadership.release()
        await self.responses.close()
        await self.records.close()
        if self.client is not None:
            await self.client.aclose()


def backend_of(config: RouterConfig | RouterSection) -> str:
    """The configured responses store, its default resolved: redis with a state_url, else
    sqlite. Refuses redis without a state_url."""
    chosen = config.responses_store or ("redis" if config.state_url else "sqlite")
    if chosen == "redis" and not config.state_url:
        raise ConfigError("responses_store = redis needs state_url (redis://HOST:PORT/DB)")
    return chosen


def open_state(config: RouterConfig) -> RouterState:
    """Open the configured stores (no network I/O yet: a Redis client connects on first use)."""
    bounds = (config.responses_store_size, config.responses_store_bytes)
    bounds += (config.responses_store_ttl_s,)
    backend, client, ledger = backend_of(config), None, MemoryLedger()
    leadership: Leadership = SoleLeader(router_id(config.port))
    if config.state_url:
        from router.store.redis_budgets import RedisLedger
        from router.store.redis_client import connect
        from router.store.redis_placement import RedisLeadership

        client = connect(config.state_url)
        ledger = RedisLedger(client)
        leadership = RedisLeadership(client, router_id(config.port), config.placement_lease_s)
    if backend == "redis":
        from router.store.redis_records import RedisRecords
        from router.store.redis_responses import RedisResponses

        responses, records = RedisResponses(client, *bounds), RedisRecords(client)
        return RouterState(responses, ledger, "redis (state_url)", client, records, leadership)
    if backend == "memory":
        return RouterState(
            MemoryResponses(*bounds), ledger, "memory", client, leadership=leadership
        )
    from router.store.sqlite import SqliteResponses

    path = config.responses_store_path or default_store_path(config.port)
    records = SqliteRecords(records_path(Path(path)))
    where = f"sqlite {path}"
    return RouterState(SqliteResponses(path, *bounds), ledger, where, client, records, leadership)


def router_id(port: int) -> str:
    """This router among the fleet's, for the logs and the lease: HOST:PORT/PID (a router
    restarted is another one: it starts from the leader's state, not its own)."""
    return f"{socket.gethostname()}:{port}/{os.getpid()}"
