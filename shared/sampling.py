"""Sampling parameters: built by the router from the HTTP body, carried to the worker."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


class InvalidRequest(ValueError):
    """A request a user sent that can't be served as asked; the message says why."""


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0  # 0 = off
    max_tokens: int = 256
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    seed: int | None = None
    logprobs: bool = False

    def validate(self) -> None:
        """Raise InvalidRequest naming the first bad value."""
        if not 0.0 <= self.temperature <= 100.0:
            raise InvalidRequest(f"temperature must be in [0, 100], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequest(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise InvalidRequest(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 <= self.min_p < 1.0:
            raise InvalidRequest(f"min_p must be in [0, 1), got {self.min_p}")
        if self.max_tokens < 1:
            raise InvalidRequest(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise InvalidRequest(f"seed must be in [0, 2**63), got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["stop_token_ids"] = list(self.stop_token_ids)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> SamplingParams:
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        if "stop_token_ids" in known:
            known["stop_token_ids"] = tuple(known["stop_token_ids"])
        return cls(**known)
