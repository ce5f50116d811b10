"""What one worker of a model takes of its host's memory, as placement counts it.

    weights (the model directory's weight files, as they load) + KV budget + runtime

`runtime` is the process itself (Python, MLX, the tokenizer, a step's activations): measured
here at about 0.5 GiB for the CPU back-end on small models, where weights are float32 (docs/deploy.md, "Models placed by
demand"); the host agents report every worker's real resident memory beside this estimate,
and a [[models]] `memory` set by the operator replaces it.
"""

from __future__ import annotations

import json
import math
import platform
import struct
import sys
from pathlib import Path

WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".npz", ".bin")
RUNTIME_BYTES = 768 << 20
DEFAULT_KV_BYTES = 1 << 30  # a host-started worker's KV budget when nothing sets one


def weight_bytes(model_dir: Path, float32: bool = False) -> int:
    """Bytes of the model's weights as a worker holds them: the weight files' size, or with
    `float32` (MLX's CPU back-end, which computes in float32 and dequantizes quantized
    weights) four bytes per parameter, counted from the safetensors headers. 0: none found."""
    try:
        files = [p for p in Path(model_dir).iterdir() if p.suffix in WEIGHT_SUFFIXES]
        on_disk = sum(p.stat().st_size for p in files if p.is_file())
    except OSError:
        return 0
    if not float32:
        return on_disk
    params = _parameters(Path(model_dir), [p for p in files if p.suffix == ".safetensors"])
    return 4 * params if params else 2 * on_disk


def _parameters(model_dir: Path, files: list[Path]) -> int:
    """Parameters in safetensors files: packed quantized weights counted unpacked (the bits
    from config.json's `quantization`), their scales and biases left out. 0: unreadable."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    quant = config.get("quantization") or {}
    count = 0
    for path in files:
        try:
            with open(path, "rb") as f:
                (length,) = struct.unpack("<Q", f.read(8))
                if length > min(path.stat().st_size, 1 << 26):  # not a safetensors file
                    return 0
                header = json.loads(f.read(length))
            tensors = [
                (n, t["dtype"], math.prod(t["shape"]))
                for n, t in header.items()
                if n != "__metadata__"
            ]
        except (OSError, ValueError, TypeError, KeyError, AttributeError, struct.error):
            return 0
        for name, dtype, elements in tensors:
            if name.endswith((".scales", ".biases")):
                continue
            if dtype == "U32" and quant:
                module = quant.get(name.rsplit(".", 1)[0])
                bits = (module if isinstance(module, dict) else quant).get("bits", 4)
                elements *= 32 // int(bits)
            count += elements
    return count


def computes_in_float32(compute_dtype: str) -> bool:
    """Whether workers hold float32 weights: asked for, or "auto" off Apple Silicon (the
    fleet's hosts are taken to be the router's kind of machine)."""
    apple = sys.platform == "darwin" and platform.machine() == "arm64"
    return compute_dtype == "float32" or (compute_dtype == "auto" and not apple)


def estimate(
    model_dir: Path,
    kv_bytes: int,
    runtime_bytes: int = RUNTIME_BYTES,
    float32: bool = False,
    listed_bytes: int | None = None,
) -> int:
    """One worker's memory by our estimate; `listed_bytes`: the weights are not in
    `model_dir` (a Hub source), their files take that many bytes by the Hub's listing."""
    if listed_bytes is None:
        weights = weight_bytes(model_dir, float32)
    else:
        weights = listed_weight_bytes(model_dir, listed_bytes, float32)
    return weights + kv_bytes + runtime_bytes


def listed_weight_bytes(model_dir: Path, on_disk: int, float32: bool) -> int:
    """Weights as a worker holds them from their files' size alone (no header to count
    parameters in): as they are, or on the float32 path 32/bits times a quantized model's
    files (config.json's `quantization`; scales and biases make it a little over) and twice
    another's (16-bit weights; a float32 model is counted over)."""
    if not float32:
        return on_disk
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    quant = config.get("quantization") if isinstance(config, dict) else None
    bits = quant.get("bits") if isinstance(quant, dict) else None
    return on_disk * 32 // bits if isinstance(bits, int) and bits > 0 else 2 * on_disk


def gib(n: int) -> str:
    """Bytes as GiB for messages: '1.25 GiB'."""
    return f"{n / (1 << 30):.2f} GiB"
