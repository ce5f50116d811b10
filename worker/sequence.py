"""One request's state inside the engine: its tokens, its blocks, how far its KV is computed."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import mlx.core as mx

from shared.sampling import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"  # queued; holds no blocks
    RUNNING = "running"  # admitted: holds blocks, prefilling or decoding
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    request_id: str
    prompt_len: int
    tokens: list[int]  # prompt + generated so far
    sampling: SamplingParams
    arrival: int  # admission order, for preempting the newest first
    status: Status = Status.WAITING
    block_ids: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens whose K/V are in the pool
    num_cached: int = 0  # prompt tokens served from the prefix cache (first admission)
    lock_node: object | None = None  # radix node locked for this sequence
    inserted_tokens: int = 0  # tokens already handed to the radix cache
    rng_key: mx.array | None = None
    logprobs: list[float] = field(default_factory=list)
    num_preemptions: int = 0

    @property
    def num_output(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def num_uncomputed(self) -> int:
        return len(self.tokens) - self.num_computed

    @property
    def is_prefilling(self) -> bool:
        return self.num_uncomputed > 1

    @property
    def output_tokens(self) -> list[int]:
        return self.tokens[self.prompt_len :]
