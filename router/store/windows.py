"""What each API key spent in the last minute, for its budget (router/http/budgets.py): the
(time, amount) events of its requests and of its tokens, and where they are kept.

`MemoryLedger` keeps them in this process; router/store/redis_budgets.py in the fleet's shared
Redis, so every router charges one budget. Either way a ledger admits atomically: one request is
charged only when the key is under both limits, so two routers can't both take the last one.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import NamedTuple, Protocol

WINDOW_S = 60.0
Events = tuple[tuple[float, int], ...]  # (time, amount), oldest first, all inside the window


@dataclass(frozen=True)
class Spent:
    requests: Events = ()
    tokens: Events = ()


class Admission(NamedTuple):
    admitted: bool
    spent: Spent  # the admitted request included


class Ledger(Protocol):
    async def admit(self, key_id: str, now: float, rpm: int | None, tpm: int | None) -> Admission:
        """Charge one request to `key_id` when it is under `rpm` requests and `tpm` tokens
        (None: no limit). Mutates."""
        ...

    async def add_tokens(self, key_id: str, now: float, tokens: int) -> None: ...

    async def spent(self, key_id: str, now: float) -> Spent: ...


def total(events: Events) -> int:
    return sum(amount for _, amount in events)


def under(events: Events, limit: int | None) -> bool:
    return limit is None or total(events) < limit


def wait_below(events: Events, limit: int, now: float) -> float:
    """Seconds until the total falls below `limit` (0: it is below now)."""
    left = total(events)
    for at, amount in events:
        if left < limit:
            break
        left -= amount
        if left < limit:
            return max(0.0, at + WINDOW_S - now)
    return 0.0


def reset(events: Events, now: float) -> float:
    """Seconds until the window is empty again."""
    return events[-1][0] + WINDOW_S - now if events else 0.0


class _Window:
    """(time, amount) events of the last WINDOW_S seconds, in this process."""

    def __init__(self):
        self._events: deque[tuple[float, int]] = deque()

    def events(self, now: float) -> Events:
        while self._events and self._events[0][0] <= now - WINDOW_S:
            self._events.popleft()
        return tuple(self._events)

    def add(self, now: float, amount: int) -> None:
        if amount:
            self._events.append((now, amount))


class MemoryLedger:
    """Each key's windows in this process (one router: nothing to share)."""

    def __init__(self):
        self._requests: dict[str, _Window] = {}
        self._tokens: dict[str, _Window] = {}

    async def admit(self, key_id: str, now: float, rpm: int | None, tpm: int | None) -> Admission:
        requests = self._requests.setdefault(key_id, _Window())
        tokens = self._tokens.setdefault(key_id, _Window()).events(now)
        admitted = under(requests.events(now), rpm) and under(tokens, tpm)
        if admitted:
            requests.add(now, 1)
        return Admission(admitted, Spent(requests.events(now), tokens))

    async def add_tokens(self, key_id: str, now: float, tokens: int) -> None:
        self._tokens.setdefault(key_id, _Window()).add(now, tokens)

    async def spent(self, key_id: str, now: float) -> Spent:
        requests, tokens = self._requests.get(key_id), self._tokens.get(key_id)
        return Spent(requests.events(now) if requests else (), tokens.events(now) if tokens else ())
