"""Who places, when several routers serve one fleet (issue 50): one router at a time leads
placement, and it alone asks host agents to start and stop workers; the others follow. A
follower tells the leader what its requests need (the models they wait for, when each was
last used, a keep-alive a request set) and mirrors what the leader decided (its starts, its
stops, the failures, the catalog's settings), so `max_workers`, keep-alive and the LRU order
are counted once for the fleet. The operator's load, unload and pin asked of a follower are
forwarded to the leader. Every router still hears every host agent and every worker
itself: a follower's waiting request is answered when the worker registers with it.

A router alone leads itself (`SoleLeader`); routers sharing a Redis server (`state_url`) hold
a lease there (router/store/redis_placement.py): the leader renews it every second, and when
it dies the lease runs out and another router takes it over. What crosses between routers is
plain JSON (router/placement/shared.py builds and reads it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class Pulled:
    """What a router read before its once-a-second turn."""

    state: dict | None = None  # the leader's last state (read while following, or taking over)
    demands: list[dict] = field(default_factory=list)  # the other routers' (read while leading)
    orders: list[dict] = field(default_factory=list)  # the operator's, forwarded (the leader's)


class Leadership(Protocol):
    router_id: str

    @property
    def leading(self) -> bool:
        """This router leads placement now (its lease is held and not run out)."""
        ...

    @property
    def leader(self) -> str | None:
        """The leading router's id, as last read (None: no router leads)."""
        ...

    async def pull(self) -> Pulled:
        """Renew the lease, or take it when no router holds it; then the leader's state (a
        follower's, or a router that just took over) or the followers' demand (the leader's)."""
        ...

    async def publish_state(self, state: dict) -> None:
        """The leader's: what it decided, for the followers to mirror."""
        ...

    async def publish_demand(self, demand: dict) -> None:
        """A follower's: what its requests need, for the leader."""
        ...

    async def send_orders(self, orders: list[dict]) -> None:
        """A follower's: the operator's load, unload and pin, for the leader to do."""
        ...

    async def release(self) -> None:
        """Give the lease up (a router stopping): another takes over at its next turn."""
        ...


class SoleLeader:
    """A router without a shared store: it leads itself, and shares nothing."""

    def __init__(self, router_id: str = "this router"):
        self.router_id = router_id

    @property
    def leading(self) -> bool:
        return True

    @property
    def leader(self) -> str | None:
        return self.router_id

    async def pull(self) -> Pulled:
        return Pulled()

    async def publish_state(self, state: dict) -> None:
        pass

    async def publish_demand(self, demand: dict) -> None:
        pass

    async def send_orders(self, orders: list[dict]) -> None:
        pass

    async def release(self) -> None:
        pass
