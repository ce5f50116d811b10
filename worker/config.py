"""Engine tunables. The ones a fleet config or a flag sets take their defaults from their one
declaration in shared/config/sections.py ([worker] / [model]); the engine-only knobs (no key,
no flag: tests, benchmarks) are declared here, once."""

from __future__ import annotations

from dataclasses import dataclass

from shared.config.choices import KV_BITS, SPECULATIVE_MODES
from shared.config.sections import ModelSection, WorkerSection, default_of


def _worker(name: str):
    return default_of(WorkerSection, name)


@dataclass(frozen=True)
class EngineConfig:
    block_size: int = _worker("block_size")
    # KV budget: explicit bytes win; else a fraction of device memory (Metal: GPU working
    # set; CPU: system RAM).
    kv_memory_bytes: int | None = _worker("kv_memory")
    kv_memory_fraction: float = _worker("kv_fraction")
    # the whole worker's (weights + KV + a step's activations): the pool and the step token
    # budget are cut to fit it; None: Metal's recommended working set, else a share of RAM
    memory_budget_bytes: int | None = _worker("memory_budget")
    num_blocks: int | None = None  # exact block count (tests); overrides both budgets
    max_running: int = _worker("max_running")  # sequences decoding at once
    prefill_chunk: int = _worker("prefill_chunk")  # most prompt tokens of one sequence per step
    step_token_budget: int = 1024  # decode tokens + prefill tokens per step
    compute_dtype: str = default_of(ModelSection, "compute_dtype")
    attention_backend: str = _worker("attention_backend")
    enable_prefix_cache: bool = True  # off: no prompt reuse (for benchmarks and debugging)
    max_waiting: int = 4096  # bounded queue: add_request refuses beyond it
    warmup: bool = True
    # speculative decoding: "ngram" (prompt lookup) drafts up to spec_tokens tokens for greedy
    # sequences, per row where it pays (worker/engine/speculative.py); "off"
    speculative: str = _worker("speculative")
    spec_tokens: int = 4
    # KV tier on disk: blocks evicted from the prefix cache are kept in files (bounded) and
    # read back on a later hit; None: off. Its folder: None = DEFAULT_KV_DISK_DIR.
    kv_disk_bytes: int | None = _worker("kv_disk")
    kv_disk_dir: str | None = None
    # K/V quantization of the pool: None or 16 = the compute dtype; 8 / 4 (worker/kv/quant.py)
    kv_bits: int | None = _worker("kv_bits")
    kv_group_size: int = _worker("kv_group_size")
    # queue decode step n+1 before reading step n's tokens (off: for measuring its gain)
    pipeline_decode: bool = True
    # sliding-window layers keep K/V in pages, given back once out of every window
    # (worker/kv/window_pages.py); off: they take a block's share like full layers
    release_windows: bool = True
    # hybrid models: snapshots of the recurrent states kept for prefix hits (worker/state);
    # None: two per running sequence, within half the KV memory; 0: no prefix hits for them
    state_snapshots: int | None = None
    # share of the pool cache pins may hold (worker/kv/pins.py); past it, the oldest
    # pins are released first
    pin_share: float = _worker("pin_share")
    # batch work waits this long after the last interactive request ends, for the next one
    # (worker/engine/batch_yield.py)
    batch_hold_s: float = _worker("batch_hold_s")

    def validate(self) -> None:
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.prefill_chunk < self.block_size:
            raise ValueError("prefill_chunk must be at least one block")
        if self.step_token_budget < self.prefill_chunk:
            raise ValueError("step_token_budget must be at least prefill_chunk")
        if self.max_running < 1:
            raise ValueError("max_running must be >= 1")
        if self.speculative not in SPECULATIVE_MODES:
            modes = " or ".join(repr(m) for m in SPECULATIVE_MODES)
            raise ValueError(f"speculative must be {modes}, got {self.speculative!r}")
        if self.spec_tokens < 1:
            raise ValueError("spec_tokens must be >= 1")
        if self.kv_disk_bytes is not None and self.kv_disk_bytes < 1:
            raise ValueError("kv_disk_bytes must be positive")
        if self.kv_bits is not None and self.kv_bits not in KV_BITS:
            raise ValueError(f"kv_bits must be one of {KV_BITS}, got {self.kv_bits}")
        if self.kv_group_size not in (32, 64, 128):
            raise ValueError(f"kv_group_size must be 32, 64 or 128, got {self.kv_group_size}")
        if self.batch_hold_s < 0:
            raise ValueError(f"batch_hold_s must be >= 0, got {self.batch_hold_s}")
        if not 0 <= self.pin_share <= 1:
            raise ValueError(f"pin_share must be in [0, 1], got {self.pin_share}")
        if not 0 < self.kv_memory_fraction < 1:
            raise ValueError("kv_memory_fraction must be in (0, 1)")
