"""A simulated worker: a BlockLRU prefix cache and a cost model for prefill and decode.

Prefill is serial on a worker (one prefill stream, as our engine's chunked prefill is) and
costs `prefill_s_per_token` per uncached prompt token; decode costs `decode_step_s +
decode_s_per_seq x batch` per output token, the batch being the requests running when the
request starts decoding (a fixed share: simple, and batch-dependent where it matters).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from scripts.fleetsim.block_lru import BlockLRU
from shared.hashing import hash_blocks
from shared.kv_events import KVEvent
from shared.protocol import Heartbeat, Register


@dataclass(frozen=True)
class CostModel:
    prefill_s_per_token: float = 0.0002  # 5k uncached tokens/s
    decode_step_s: float = 0.02
    decode_s_per_seq: float = 0.001


@dataclass
class Running:
    hashes: list[int]
    private: int
    prompt_tokens: int
    cached_tokens: int


class SimWorker:
    def __init__(
        self,
        worker_id: str,
        capacity_blocks: int,
        block_size: int,
        cost: CostModel,
        emit: Callable[[str, KVEvent], None],
    ):
        self.worker_id = worker_id
        self.block_size = block_size
        self.cost = cost
        self.cache = BlockLRU(capacity_blocks, lambda event: emit(worker_id, event))
        self.running: dict[str, Running] = {}
        self.prefill_free_at = 0.0
        self.hit_tokens = 0
        self.prompt_tokens = 0
        self.requests = 0

    def register(self) -> Register:
        return Register(
            self.worker_id, "sim", self.block_size, self.cache.capacity_blocks, "sim", 0
        )

    def start(self, wire_id: str, token_ids: tuple[int, ...], max_tokens: int, now: float) -> float:
        """Mutates: admit a request; returns when it finishes."""
        hashes = hash_blocks(token_ids, self.block_size)
        tail = len(token_ids) - len(hashes) * self.block_size + max_tokens
        private = -(-tail // self.block_size)
        matched = self.cache.admit(hashes, token_ids, self.block_size, private)
        cached = matched * self.block_size
        self.running[wire_id] = Running(hashes, private, len(token_ids), cached)
        self.hit_tokens += cached
        self.prompt_tokens += len(token_ids)
        self.requests += 1
        prefill_end = max(now, self.prefill_free_at) + self.cost.prefill_s_per_token * (
            len(token_ids) - cached
        )
        self.prefill_free_at = prefill_end
        step = self.cost.decode_step_s + self.cost.decode_s_per_seq * len(self.running)
        return prefill_end + max_tokens * step

    def finish(self, wire_id: str) -> Running:
        """Mutates: the request is done; its blocks stay cached, unlocked."""
        done = self.running.pop(wire_id)
        self.cache.release(done.hashes, done.private)
        return done

    def heartbeat(self) -> Heartbeat:
        return Heartbeat(
            worker_id=self.worker_id,
            running=len(self.running),
            waiting=0,
            free_blocks=self.cache.free_blocks,
            total_blocks=self.cache.capacity_blocks,
            cached_blocks=self.cache.evictable_blocks,
            hit_tokens=self.hit_tokens,
            prompt_tokens=self.prompt_tokens,
            evictable_blocks=self.cache.evictable_blocks,
            evicted_blocks=self.cache.evicted_blocks,
        )
