"""Budgets per API key: requests and tokens per minute, over a sliding window of 60 s.

A request is charged when it is let in; its tokens (prompt + completion) when its usage is
known, at its end. A key whose window holds its requests-per-minute, or its tokens-per-minute
or more, is refused with 429 and Retry-After (the seconds until enough of the window expires),
and every response to a budgeted key carries OpenAI's `x-ratelimit-*` headers. Keys are named
by fingerprint (router/http/api_keys.py), never by their text.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from router.errors import ApiError

WINDOW_S = 60.0


@dataclass(frozen=True)
class Budget:
    rpm: int | None = None  # requests per minute
    tpm: int | None = None  # prompt + completion tokens per minute

    @property
    def limited(self) -> bool:
        return self.rpm is not None or self.tpm is not None


class _Window:
    """(time, amount) events of the last WINDOW_S seconds."""

    def __init__(self):
        self._events: deque[tuple[float, int]] = deque()
        self._total = 0

    def total(self, now: float) -> int:
        while self._events and self._events[0][0] <= now - WINDOW_S:
            self._total -= self._events.popleft()[1]
        return self._total

    def add(self, now: float, amount: int) -> None:
        if amount:
            self._events.append((now, amount))
            self._total += amount

    def wait_below(self, limit: int, now: float) -> float:
        """Seconds until the total falls below `limit` (0: it is below now)."""
        total = self.total(now)
        for at, amount in self._events:
            if total < limit:
                break
            total -= amount
            if total < limit:
                return max(0.0, at + WINDOW_S - now)
        return 0.0

    def reset(self, now: float) -> float:
        """Seconds until the window is empty again."""
        self.total(now)
        return self._events[-1][0] + WINDOW_S - now if self._events else 0.0


class KeyBudgets:
    """The budget of each key (by fingerprint) and what each spent in the last minute."""

    def __init__(
        self,
        per_key: Mapping[str, Budget],
        default: Budget = Budget(),
        clock: Callable[[], float] = time.monotonic,
    ):
        self._per_key = dict(per_key)
        self._default = default
        self.clock = clock  # injectable: tests move time without sleeping
        self._requests: dict[str, _Window] = {}
        self._tokens: dict[str, _Window] = {}

    def budget(self, key_id: str) -> Budget:
        return self._per_key.get(key_id, self._default)

    def admit(self, key_id: str) -> dict[str, str]:
        """Charge one request to `key_id` and return the headers its response carries; raise
        a 429 ApiError (with those headers and Retry-After) when the key is over a budget."""
        budget, now = self.budget(key_id), self.clock()
        if not budget.limited:
            return {}
        requests = self._requests.setdefault(key_id, _Window())
        tokens = self._tokens.setdefault(key_id, _Window())
        wait = 0.0
        if budget.rpm is not None:
            wait = requests.wait_below(budget.rpm, now)
        if budget.tpm is not None:
            wait = max(wait, tokens.wait_below(budget.tpm, now))
        if wait > 0:
            over = (
                "requests"
                if budget.rpm is not None and requests.total(now) >= budget.rpm
                else "tokens"
            )
            headers = self.headers(key_id) | {"Retry-After": str(max(1, math.ceil(wait)))}
            raise over_budget(over, budget, wait, headers)
        requests.add(now, 1)
        return self.headers(key_id)

    def charge_tokens(self, key_id: str, tokens: int) -> None:
        if self.budget(key_id).tpm is not None:
            self._tokens.setdefault(key_id, _Window()).add(self.clock(), tokens)

    def headers(self, key_id: str) -> dict[str, str]:
        """OpenAI's x-ratelimit-* headers for the key's state now."""
        budget, now, headers = self.budget(key_id), self.clock(), {}
        for kind, limit, windows in (
            ("requests", budget.rpm, self._requests),
            ("tokens", budget.tpm, self._tokens),
        ):
            if limit is None:
                continue
            window = windows.setdefault(key_id, _Window())
            headers[f"x-ratelimit-limit-{kind}"] = str(limit)
            headers[f"x-ratelimit-remaining-{kind}"] = str(max(0, limit - window.total(now)))
            headers[f"x-ratelimit-reset-{kind}"] = duration(window.reset(now))
        return headers


class OverBudget(ApiError):
    """429: a key over its requests (`kind` "requests") or tokens ("tokens") per minute."""

    def __init__(self, kind: str, limit: int | None, wait_s: float, headers: dict[str, str]):
        super().__init__(
            429,
            f"this API key used its {limit} {kind} per minute; retry in {math.ceil(wait_s)} s",
            code="rate_limit_exceeded",
            type="rate_limit_error",
            headers=headers,
        )
        self.kind = kind


def over_budget(kind: str, budget: Budget, wait_s: float, headers: dict[str, str]) -> OverBudget:
    return OverBudget(kind, budget.rpm if kind == "requests" else budget.tpm, wait_s, headers)


def duration(seconds: float) -> str:
    """A reset time as OpenAI writes it: '250ms', '1.5s', '1m0s'."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    if seconds < 60:
        return f"{seconds:.3g}s"
    return f"{int(seconds // 60)}m{int(seconds % 60)}s"


def budgets_of(config, clock: Callable[[], float] = time.monotonic) -> KeyBudgets:
    """The budgets a RouterConfig sets: [router] key_rpm / key_tpm for every key, each key's
    line of the keys file over them."""
    from router.http.api_keys import key_fingerprint

    default = Budget(config.key_rpm, config.key_tpm)
    per_key = {
        key_fingerprint(key): Budget(
            options.get("rpm", default.rpm), options.get("tpm", default.tpm)
        )
        for key, options in config.key_budgets.items()
    }
    return KeyBudgets(per_key, default, clock)
