"""Seeded simulated traffic: Zipf-distributed tenants, each with a shared system prompt, and
multi-turn sessions whose next turn extends the previous prompt with its answer and a new
question. Tokens are synthetic ids: only which prefixes repeat matters to routing."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TrafficShape:
    tenants: int = 24
    zipf_s: float = 0.0  # 0: uniform tenants
    system_tokens: int = 1400
    question_tokens: int = 20
    output_tokens: int = 32
    continue_prob: float = 0.0  # chance a request is the next turn of a live session
    max_turns: int = 6
    sessions_per_tenant: int = 8  # live sessions kept per tenant (oldest replaced)


@dataclass(frozen=True)
class SimRequest:
    arrival_s: float
    tenant: int
    token_ids: tuple[int, ...]
    max_tokens: int


@dataclass
class _Session:
    tokens: tuple[int, ...]
    turns: int = 1


@dataclass
class Traffic:
    shape: TrafficShape
    seed: int
    _rng: random.Random = field(init=False)
    _systems: list[tuple[int, ...]] = field(init=False)
    _weights: list[float] = field(init=False)
    _sessions: dict[int, list[_Session]] = field(init=False, default_factory=dict)

    def __post_init__(self):
        self._rng = random.Random(self.seed)
        self._systems = [self._tokens(self.shape.system_tokens) for _ in range(self.shape.tenants)]
        self._weights = [1 / (rank + 1) ** self.shape.zipf_s for rank in range(self.shape.tenants)]

    def requests(self, count: int, rate_per_s: float) -> list[SimRequest]:
        """`count` requests with Poisson arrivals at `rate_per_s`."""
        now, out = 0.0, []
        for _ in range(count):
            now += self._rng.expovariate(rate_per_s)
            out.append(self._next(now))
        return out

    def _next(self, now: float) -> SimRequest:
        s = self.shape
        tenant = self._rng.choices(range(s.tenants), self._weights)[0]
        live = self._sessions.setdefault(tenant, [])
        question = self._tokens(s.question_tokens)
        if live and self._rng.random() < s.continue_prob:
            session = self._rng.choice(live)
            answer = self._tokens(s.output_tokens)
            session.tokens += answer + question
            session.turns += 1
            if session.turns >= s.max_turns:
                live.remove(session)
        else:
            session = _Session(self._systems[tenant] + question)
            live.append(session)
            if len(live) > s.sessions_per_tenant:
                live.pop(0)
        return SimRequest(now, tenant, session.tokens, s.output_tokens)

    def _tokens(self, n: int) -> tuple[int, ...]:
        return tuple(self._rng.randrange(1, 49_000) for _ in range(n))
