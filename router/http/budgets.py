"""Budgets per API key: requests and tokens per minute, over a sliding window of 60 s.

A request is charged when it is let in; its tokens (prompt + completion) when its usage is
known, at its end. A key whose window holds its requests-per-minute, or its tokens-per-minute
or more, is refused with 429 and Retry-After (the seconds until enough of the window expires),
and every response to a budgeted key carries OpenAI's `x-ratelimit-*` headers. Keys are named
by fingerprint (router/http/api_keys.py), never by their text. The windows live in a ledger
(router/store/windows.py): this router's memory, or the fleet's shared Redis with `state_url`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from router.errors import ApiError
from router.store.windows import MemoryLedger, Spent, reset, total, under, wait_below

if TYPE_CHECKING:
    from router.store.windows import Ledger


@dataclass(frozen=True)
class Budget:
    rpm: int | None = None  # requests per minute
    tpm: int | None = None  # prompt + completion tokens per minute

    @property
    def limited(self) -> bool:
        return self.rpm is not None or self.tpm is not None


class KeyBudgets:
    """The budget of each key (by fingerprint) and what each spent in the last minute."""

    def __init__(
        self,
        per_key: Mapping[str, Budget],
        default: Budget = Budget(),
        clock: Callable[[], float] = time.monotonic,
        ledger: Ledger | None = None,
    ):
        self._per_key = dict(per_key)
        self._default = default
        self.clock = clock  # injectable: tests move time without sleeping
        self._ledger = MemoryLedger() if ledger is None else ledger

    def budget(self, key_id: str) -> Budget:
        return self._per_key.get(key_id, self._default)

    async def admit(self, key_id: str) -> dict[str, str]:
        """Charge one request to `key_id` and return the headers its response carries; raise
        a 429 ApiError (with those headers and Retry-After) when the key is over a budget."""
        budget, now = self.budget(key_id), self.clock()
        if not budget.limited:
            return {}
        admitted, spent = await self._ledger.admit(key_id, now, budget.rpm, budget.tpm)
        headers = self._headers(budget, spent, now)
        if admitted:
            return headers
        wait = 0.0
        if budget.rpm is not None:
            wait = wait_below(spent.requests, budget.rpm, now)
        if budget.tpm is not None:
            wait = max(wait, wait_below(spent.tokens, budget.tpm, now))
        over = "tokens" if under(spent.requests, budget.rpm) else "requests"
        retry = {"Retry-After": str(max(1, math.ceil(wait)))}
        raise over_budget(over, budget, wait, headers | retry)

    async def charge_tokens(self, key_id: str, tokens: int) -> None:
        if self.budget(key_id).tpm is not None and tokens > 0:
            await self._ledger.add_tokens(key_id, self.clock(), tokens)

    async def headers(self, key_id: str) -> dict[str, str]:
        """OpenAI's x-ratelimit-* headers for the key's state now."""
        budget, now = self.budget(key_id), self.clock()
        if not budget.limited:
            return {}
        return self._headers(budget, await self._ledger.spent(key_id, now), now)

    @staticmethod
    def _headers(budget: Budget, spent: Spent, now: float) -> dict[str, str]:
        headers = {}
        for kind, limit, events in (
            ("requests", budget.rpm, spent.requests),
            ("tokens", budget.tpm, spent.tokens),
        ):
            if limit is None:
                continue
            headers[f"x-ratelimit-limit-{kind}"] = str(limit)
            headers[f"x-ratelimit-remaining-{kind}"] = str(max(0, limit - total(events)))
            headers[f"x-ratelimit-reset-{kind}"] = duration(reset(events, now))
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


def budgets_of(config, ledger: Ledger | None = None) -> KeyBudgets:
    """The budgets a RouterConfig sets: [router] key_rpm / key_tpm for every key, each key's
    line of the keys file over them; kept in `ledger` (default: this process's memory). A
    shared ledger is read on the wall clock, which the routers share; one router's on the
    monotonic clock."""
    from router.http.api_keys import key_fingerprint

    default = Budget(config.key_rpm, config.key_tpm)
    per_key = {
        key_fingerprint(key): Budget(
            options.get("rpm", default.rpm), options.get("tpm", default.tpm)
        )
        for key, options in config.key_budgets.items()
    }
    clock = time.monotonic if ledger is None or isinstance(ledger, MemoryLedger) else time.time
    return KeyBudgets(per_key, default, clock, ledger)
