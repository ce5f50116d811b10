"""What the router knows of each host agent: its budget, its worker processes, its liveness."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.placement.footprint import gib
from shared.placement.messages import HostFetch, HostHello, HostWorker


@dataclass(eq=False)
class HostState:
    hello: HostHello
    identity: bytes  # the ZeroMQ routing id of its DEALER socket
    last_seen: float
    budget_bytes: int
    workers: dict[str, HostWorker] = field(default_factory=dict)  # live processes, by id
    alive: bool = True
    stopping: set[str] = field(default_factory=set)  # workers asked to stop, not gone yet
    held: tuple[str, ...] = ()  # Hub models whose files it holds, checked (its last report)
    fetches: dict[str, HostFetch] = field(default_factory=dict)  # under way, by model

    def __post_init__(self) -> None:
        self.reported(self.hello.held, self.hello.fetches)

    @property
    def id(self) -> str:
        return self.hello.host_id

    def reads(self, model: str) -> bool:
        return model in self.hello.models

    def reported(self, held: tuple[str, ...], fetches: tuple[HostFetch, ...]) -> None:
        """Mutates: what a HostHello or HostReport says of its Hub models."""
        self.held = held
        self.fetches = {f.model: f for f in fetches}

    def holds(self, model: str) -> bool:
        """A Hub model's files are here, checked: a start needs no fetch (placement prefers
        such a host; a model read from a path is held alike by every host that reads it)."""
        return model in self.held

    @staticmethod
    def cost(worker: HostWorker) -> int:
        """What a worker takes by our count: its estimate, or more if it measures more."""
        return max(worker.estimate_bytes, worker.rss_bytes)

    def used(self, starting: int = 0) -> int:
        """Bytes its workers take (a stopping one until its process is gone), plus `starting`
        (estimates of starts sent and not reported yet; a start that waits for its victims
        to go is not counted here: their room is still theirs)."""
        return sum(self.cost(w) for w in self.workers.values()) + starting

    def over_estimate(self) -> list[HostWorker]:
        """Workers measured above their estimate (the estimate is checked, not trusted)."""
        return [w for w in self.workers.values() if w.rss_bytes > w.estimate_bytes]

    def to_json(self, starting: int = 0) -> dict:
        used = self.used(starting)
        return {
            "id": self.id,
            "host": self.hello.host,
            "pid": self.hello.pid,
            "alive": self.alive,
            "budget_bytes": self.budget_bytes,
            "used_bytes": used,
            "starting_bytes": starting,
            "free_bytes": self.budget_bytes - used,
            "budget": gib(self.budget_bytes),
            "total_bytes": self.hello.total_bytes,
            "models": list(self.hello.models),
            "held": list(self.held),
            "fetches": [
                {"model": f.model, "done_bytes": f.done_bytes, "total_bytes": f.total_bytes}
                for f in self.fetches.values()
            ],
            "workers": [
                {
                    "worker_id": w.worker_id,
                    "model": w.model,
                    "pid": w.pid,
                    "estimate_bytes": w.estimate_bytes,
                    "rss_bytes": w.rss_bytes,
                    "stopping": w.worker_id in self.stopping,
                }
                for w in self.workers.values()
            ],
        }
