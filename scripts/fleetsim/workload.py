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
    cache_key: str | None = None  # prompt_cache_key


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


@dataclass(frozen=True)
class ConversationShape:
    tenants: int = 64
    header_tokens: int = 8  # a per-conversation unique first line (a timestamp, a request id)
    first_tokens: int = 16  # the first user message: header + it < one 32-token block
    question_tokens: int = 40
    output_tokens: int = 64
    continue_prob: float = 0.7
    max_turns: int = 8
    conversations_per_tenant: int = 4  # live conversations kept per tenant (oldest replaced)
    key_per: str = "tenant"  # whose prompt_cache_key a request carries: tenant or conversation


@dataclass
class Conversations:
    """Tenants' conversations that share a key but not a prefix (issue 20's prompt_cache_key
    load). A conversation's first turn is a unique header line and a short message, under one
    KV block: no block hash to route it by, and since the header differs, two conversations of
    one tenant share no prefix at all. Each next turn is the previous prompt + its reply + a new
    message, so within a conversation the prefix grows and is cacheable. Across a tenant's
    requests the tenant's key (`key_per="tenant"`) is the only stable signal; with
    `key_per="conversation"` each conversation has its own key (as Codex sends its session id)."""

    shape: ConversationShape
    seed: int
    _rng: random.Random = field(init=False)
    _live: dict[int, list[list]] = field(init=False, default_factory=dict)
    _started: int = field(init=False, default=0)

    def __post_init__(self):
        self._rng = random.Random(self.seed)

    def requests(self, count: int, rate_per_s: float) -> list[SimRequest]:
        """`count` requests with Poisson arrivals at `rate_per_s`."""
        now, out = 0.0, []
        for _ in range(count):
            now += self._rng.expovariate(rate_per_s)
            out.append(self._next(now))
        return out

    def _next(self, now: float) -> SimRequest:
        s = self.shape
        tenant = self._rng.randrange(s.tenants)
        live = self._live.setdefault(tenant, [])
        if live and self._rng.random() < s.continue_prob:
            conversation = self._rng.choice(live)  # [tokens, turns, key]
            conversation[0] += self._tokens(s.output_tokens) + self._tokens(s.question_tokens)
            conversation[1] += 1
            if conversation[1] >= s.max_turns:
                live.remove(conversation)
        else:
            self._started += 1
            first = self._tokens(s.header_tokens) + self._tokens(s.first_tokens)
            own = f"conversation-{self._started}" if s.key_per == "conversation" else None
            conversation = [first, 1, own or f"tenant-{tenant}"]
            live.append(conversation)
            if len(live) > s.conversations_per_tenant:
                live.pop(0)
        return SimRequest(now, tenant, conversation[0], s.output_tokens, conversation[2])

    def _tokens(self, n: int) -> tuple[int, ...]:
        return tuple(self._rng.randrange(1, 49_000) for _ in range(n))
