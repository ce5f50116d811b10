"""The shared Redis (or Valkey) server of a fleet's routers (`state_url`): one connection
pool per router, every key under one prefix, and its failures as a 503 a client can read.

The stores' Lua scripts build key names from arguments, which a Redis Cluster refuses: point
`state_url` at one server (with a replica for failover if you like), not a cluster.
"""

from __future__ import annotations

import contextlib
import logging

import redis.asyncio as redis
from redis.exceptions import RedisError

from router.errors import ApiError

PREFIX = "mlx-fleet:"  # every key the routers write, so the server can hold other things too
log = logging.getLogger(__name__)


def connect(url: str) -> redis.Redis:
    """A client for `url` (no I/O until the first call); calls time out after 5 s."""
    return redis.Redis.from_url(url, socket_timeout=5.0, socket_connect_timeout=5.0)


@contextlib.contextmanager
def reachable(what: str):
    """Run Redis calls; a failure becomes a 503 saying the shared state is unreachable."""
    try:
        yield
    except RedisError as e:
        log.warning("shared state server: %s failed: %s", what, e)
        raise ApiError(
            503,
            f"the routers' shared state server (Redis) did not answer ({type(e).__name__}); "
            "retry shortly",
            type="server_error",
            code="state_unavailable",
        ) from None
