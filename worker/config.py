"""Engine tunables, with defaults that suit a small model on a laptop-class machine."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineConfig:
    block_size: int = 32
    # KV budget: explicit bytes win; else a fraction of device memory (Metal: GPU working
    # set; CPU: system RAM).
    kv_memory_bytes: int | None = None
    kv_memory_fraction: float = 0.25
    num_blocks: int | None = None  # exact block count (tests); overrides both budgets
    max_running: int = 64  # sequences decoding at once
    prefill_chunk: int = 256  # most prompt tokens of one sequence per step
    step_token_budget: int = 1024  # decode tokens + prefill tokens per step
    compute_dtype: str = "auto"
    attention_backend: str = "auto"
    enable_prefix_cache: bool = True  # off: no prompt reuse (for benchmarks and debugging)
    max_waiting: int = 4096  # bounded queue: add_request refuses beyond it
    warmup: bool = True
    # KV tier on disk: blocks evicted from the prefix cache are kept in files (bounded) and
    # read back on a later hit; None: off
    # speculative decoding: "ngram" (prompt lookup) drafts up to spec_tokens tokens for greedy
    # sequences while the decode batch has at most spec_max_batch of them; "off"
    speculative: str = "off"
    spec_tokens: int = 4
    spec_max_batch: int = 8
    kv_disk_bytes: int | None = None
    kv_disk_dir: str | None = None  # default ~/.cache/mlx-fleet/kv
    # queue decode step n+1 before reading step n's tokens (off: for measuring its gain)
    pipeline_decode: bool = True

    def validate(self) -> None:
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.prefill_chunk < self.block_size:
            raise ValueError("prefill_chunk must be at least one block")
        if self.step_token_budget < self.prefill_chunk:
            raise ValueError("step_token_budget must be at least prefill_chunk")
        if self.max_running < 1:
            raise ValueError("max_running must be >= 1")
        if self.speculative not in ("off", "ngram"):
            raise ValueError(f"speculative must be 'off' or 'ngram', got {self.speculative!r}")
        if self.spec_tokens < 1:
            raise ValueError("spec_tokens must be >= 1")
        if self.kv_disk_bytes is not None and self.kv_disk_bytes < 1:
            raise ValueError("kv_disk_bytes must be positive")
        if not 0 < self.kv_memory_fraction < 1:
            raise ValueError("kv_memory_fraction must be in (0, 1)")
