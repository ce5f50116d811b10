"""Every GGUF tensor as float32, whatever its type, by llama.cpp's own Python package.

`mx.load` decodes five GGUF types (header.MLX_TYPES); K-quants (Q4_K, Q6_K...) and Q5_0
are not among them. `gguf.quants.dequantize` decodes them all in numpy: the 236 tensors of
Gemma 3 270M (Q8_0, Q5_0, Q4_K, Q6_K) take 3.0 s on one core here, 1.8 s of it the Q8_0
embedding. The bytes come from a memory map at the offsets our header reader checked.
"""

from __future__ import annotations

from collections.abc import Iterator
from math import prod
from pathlib import Path

import numpy as np

from shared.models.gguf.errors import GGUFError
from shared.models.gguf.header import GGUFHeader, TensorInfo


def dequantize_tensor(blob: np.ndarray, header: GGUFHeader, info: TensorInfo) -> np.ndarray:
    """One tensor in numpy order (the slowest dimension first), as float32."""
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize

    start = header.data_start + info.offset
    rows = prod(info.shape[1:])
    raw = blob[start : start + info.nbytes].reshape(rows, -1)
    try:
        values = dequantize(raw, GGMLQuantizationType[info.type_name])
    except NotImplementedError as exc:
        raise GGUFError(f"tensor {info.name!r}: gguf cannot dequantize {info.type_name}") from exc
    return values.astype(np.float32, copy=False).reshape(tuple(reversed(info.shape)))


def dequantized_tensors(path: Path, header: GGUFHeader) -> Iterator[tuple[str, np.ndarray]]:
    """(GGUF name, float32 array) for each tensor, one at a time, so that a caller that casts
    each to a narrower dtype holds only one float32 copy at a time."""
    blob = np.memmap(path, dtype=np.uint8, mode="r")
    for info in header.tensors:
        yield info.name, dequantize_tensor(blob, header, info)
