"""What one worker of a model takes of its host's memory, as placement counts it.

    weights (the model directory's weight files, as they load) + KV budget + runtime

`runtime` is the process itself (Python, MLX, the tokenizer, a step's activations): measured
here at about 0.5 GiB for the CPU back-end on small models (docs/deploy.md, "Models placed by
demand"); the host agents report every worker's real resident memory beside this estimate,
and a [[models]] `memory` set by the operator replaces it.
"""

from __future__ import annotations

from pathlib import Path

WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".npz", ".bin")
RUNTIME_BYTES = 768 << 20
DEFAULT_KV_BYTES = 1 << 30  # a host-started worker's KV budget when nothing sets one


def weight_bytes(model_dir: Path) -> int:
    """Bytes of the weight files in `model_dir` (0: none found, or unreadable)."""
    try:
        files = [p for p in Path(model_dir).iterdir() if p.suffix in WEIGHT_SUFFIXES]
        return sum(p.stat().st_size for p in files if p.is_file())
    except OSError:
        return 0


def estimate(model_dir: Path, kv_bytes: int, runtime_bytes: int = RUNTIME_BYTES) -> int:
    """One worker's memory by our estimate."""
    return weight_bytes(model_dir) + kv_bytes + runtime_bytes


def gib(n: int) -> str:
    """Bytes as GiB for messages: '1.25 GiB'."""
    return f"{n / (1 << 30):.2f} GiB"
