"""Per-step figures the engine keeps for `stats()`: step times, batch sizes, preemptions."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

WINDOW = 2048  # recent steps kept for percentiles


def percentile(values, q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class EngineStats:
    decode_times: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    decode_batches: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    prefill_times: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    decode_tokens: int = 0
    prefill_tokens: int = 0
    preemptions: int = 0

    def record_decode(self, seconds: float, batch: int) -> None:
        self.decode_times.append(seconds)
        self.decode_batches.append(batch)
        self.decode_tokens += batch

    def record_prefill(self, seconds: float, tokens: int) -> None:
        self.prefill_times.append(seconds)
        self.prefill_tokens += tokens

    def summary(self) -> dict:
        return {
            "decode_step_p50_ms": 1000 * percentile(self.decode_times, 0.5),
            "decode_step_p95_ms": 1000 * percentile(self.decode_times, 0.95),
            "decode_batch_mean": sum(self.decode_batches) / len(self.decode_batches)
            if self.decode_batches
            else 0.0,
            "prefill_chunk_p50_ms": 1000 * percentile(self.prefill_times, 0.5),
            "decode_tokens": self.decode_tokens,
            "prefill_tokens": self.prefill_tokens,
            "preemptions": self.preemptions,
        }
