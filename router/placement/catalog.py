"""The catalog: every model the fleet may serve, with what placement knows of it."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field

from router.errors import bad_request
from shared.placement.footprint import DEFAULT_KV_BYTES, computes_in_float32, estimate, gib

FAILURE_HOLD_S = 30.0  # a model that failed to load answers with that failure this long
FOREVER = -1.0


@dataclass(eq=False)
class Start:
    """A worker asked of a host, not registered yet."""

    worker_id: str
    host_id: str
    after: set[str] = field(default_factory=set)  # workers stopped to make room, first
    sent: bool = False  # StartWorker went out (after `after` all exited)
    adopted_at: float | None = None  # when this router learnt of it from another leader


@dataclass(eq=False)
class Entry:
    """One catalog model: its settings, its demand, its loads in flight."""

    id: str
    estimate_bytes: int
    kv_bytes: int
    min_workers: int = 0
    max_workers: int = 1
    keep_alive_s: float = 300.0
    pinned: bool = False
    last_used: float = 0.0
    keep_alive_at: float = float("-inf")  # when a request last set keep_alive_s
    starts: dict[str, Start] = field(default_factory=dict)  # by worker id
    failure: str = ""  # why its last load failed, in one line ("" none)
    failure_detail: str = ""  # the host's whole report of it (the worker's last log lines)
    failed_at: float = float("-inf")
    changed: asyncio.Event = field(default_factory=asyncio.Event)  # set, then replaced
    next_worker: int = 0
    waiting: int = 0  # requests held for it now
    waiting_elsewhere: int = 0  # held by the other routers, as they last said
    pressure_since: float | None = None  # its workers have had requests waiting since
    source: str | None = None  # the Hub repo its files come from (None: a path)
    configured: list = field(init=False)  # its settings as the config file gave them

    def __post_init__(self) -> None:
        self.configured = [self.min_workers, self.max_workers, self.keep_alive_s, self.pinned]

    def wake(self) -> None:
        """Mutates: every waiter looks again."""
        self.changed.set()
        self.changed = asyncio.Event()

    def fail(self, reason: str, now: float, detail: str = "") -> None:
        self.failure, self.failure_detail, self.failed_at = reason, detail or reason, now
        self.wake()

    def failing(self, now: float) -> str:
        """Its last load's failure while it is recent, else ""."""
        return self.failure if now - self.failed_at < FAILURE_HOLD_S else ""

    def expired(self, idle_since: float, now: float) -> bool:
        """Whether a worker idle since `idle_since` has outlived the keep-alive."""
        if self.pinned or self.keep_alive_s == FOREVER:
            return False
        return now - max(idle_since, self.last_used) >= self.keep_alive_s

    def new_worker_id(self, host_id: str) -> str:
        self.next_worker += 1
        safe = re.sub(r"[^A-Za-z0-9._-]+", "_", self.id)
        return f"{host_id}-{safe}-{self.next_worker}"

    def to_json(self) -> dict:
        return {
            "memory_bytes": self.estimate_bytes,
            "memory": gib(self.estimate_bytes),
            "kv_memory_bytes": self.kv_bytes,
            "min_workers": self.min_workers,
            "max_workers": self.max_workers,
            "keep_alive": self.keep_alive_s,
            "pinned": self.pinned,
            "loading": sorted(self.starts),
            "failure": self.failure or None,
            "source": self.source,
        }


def entry_of(spec) -> Entry:
    """The catalog entry of a router ModelSpec (its `section` holds the [[models]] keys)."""
    section = spec.section
    kv = section.kv_memory or DEFAULT_KV_BYTES
    float32 = computes_in_float32(section.compute_dtype)
    listed = spec.hub_weight_bytes
    memory = section.memory or estimate(spec.path, kv, float32=float32, listed_bytes=listed)
    return Entry(
        spec.served_id,
        memory,
        kv,
        section.min_workers,
        section.max_workers,
        section.keep_alive,
        section.pinned,
        source=section.source,
    )


_DURATION = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def keep_alive_of(value) -> float | None:
    """A request's Ollama-style `keep_alive` in seconds (None: absent): a number of seconds or
    a duration ("5m", "1h", "30s"); negative keeps the model loaded for ever, 0 unloads it
    once idle. Anything else is a 400."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise bad_request("'keep_alive' must be seconds or a duration like \"5m\"", "keep_alive")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(value) if isinstance(value, str) else None
        if match is None:
            raise bad_request(
                f"'keep_alive' must be seconds or a duration like \"5m\", got {value!r}",
                "keep_alive",
            )
        seconds = float(match.group(1)) * _SECONDS[match.group(2)]
    return FOREVER if seconds < 0 else seconds
