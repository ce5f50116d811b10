"""A bounds-checked reader of a GGUF file's header, run before any tensor is read.

MLX's GGUF reader trusts the file: a header with the right magic and garbage after it
crashes the whole process (segfault). Reading the header here first turns every bad file
into an error message: wrong magic or version, a read past the end, unknown tensor types,
tensor data that lies outside the file. It also decodes the metadata values: `gguf`'s own
`GGUFReader` builds a numpy view per array item, 15 s for Gemma 3's 262k-token vocabulary
here, while this reader takes about a second.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import BinaryIO

import numpy as np

from shared.models.gguf.errors import GGUFError

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# The types MLX's own GGUF loader decodes (mx.load); the others need `gguf`'s dequantizer.
MLX_TYPES = ("F32", "F16", "Q4_0", "Q4_1", "Q8_0")

# GGUF metadata value types: id -> struct format (None for string / array)
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # GGUF order: the fastest-moving dimension first
    type_name: str  # a `gguf.GGMLQuantizationType` name: "F32", "Q4_K", ...
    offset: int  # from data_start
    nbytes: int


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    metadata: dict  # key -> int | float | bool | str | list[str] | numpy array
    tensors: tuple[TensorInfo, ...]
    data_start: int

    @property
    def metadata_keys(self) -> tuple[str, ...]:
        return tuple(self.metadata)


class _Reader:
    def __init__(self, f: BinaryIO, size: int):
        self.f, self.size = f, size

    def raw(self, n: int) -> bytes:
        if n < 0 or self.f.tell() + n > self.size:
            raise GGUFError("truncated or corrupt GGUF header (a field runs past the end)")
        return self.f.read(n)

    def unpack(self, fmt: str):
        return struct.unpack(fmt, self.raw(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        data = self.raw(self.unpack("<Q"))
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GGUFError("corrupt GGUF header (a string is not UTF-8)") from exc

    def value(self, vtype: int):
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            item_type, count = self.unpack("<I"), self.unpack("<Q")
            if item_type in _SCALARS:  # one read for the whole array
                fmt = _SCALARS[item_type]
                data = self.raw(count * struct.calcsize(fmt))
                return np.frombuffer(data, dtype=np.dtype(fmt.replace("?", "b1")))
            return [self.value(item_type) for _ in range(count)]
        raise GGUFError(f"corrupt GGUF header (unknown value type {vtype})")


@cache
def _type_sizes() -> dict[int, tuple[str, int, int]]:
    """ggml type id -> (name, values per block, bytes per block), from llama.cpp's own table."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    return {t.value: (t.name, *GGML_QUANT_SIZES[t]) for t in GGMLQuantizationType}


def _tensor_bytes(name: str, shape: tuple[int, ...], type_id: int) -> tuple[str, int]:
    if type_id not in _type_sizes():
        raise GGUFError(f"tensor {name!r} has an unknown ggml type {type_id}")
    type_name, block, block_bytes = _type_sizes()[type_id]
    count = 1
    for d in shape:
        count *= d
    row = shape[0] if shape else 1
    if row % block:  # blocks never straddle rows
        raise GGUFError(f"tensor {name!r} has rows of {row} values, not whole {block}-value blocks")
    return type_name, count // block * block_bytes


def check_mlx_types(header: GGUFHeader) -> None:
    """Raise unless MLX's own loader (`mx.load`) decodes every tensor of the file."""
    for t in header.tensors:
        if t.type_name not in MLX_TYPES:
            raise GGUFError(
                f"tensor {t.name!r} is {t.type_name}; for this architecture MLX's GGUF loader "
                f"reads the file, and it supports {', '.join(MLX_TYPES)}"
            )


def read_header(path: Path) -> GGUFHeader:
    """Parse and validate a GGUF header; raise GGUFError with a clear message if it's bad."""
    path = Path(path)
    if not path.is_file():
        raise GGUFError(f"GGUF file not found: {path}")
    size = path.stat().st_size
    with path.open("rb") as f:
        r = _Reader(f, size)
        if size < 24 or r.raw(4) != MAGIC:
            raise GGUFError(f"{path} is not a GGUF file (bad magic)")
        version = r.unpack("<I")
        if version not in (2, 3):
            raise GGUFError(f"unsupported GGUF version {version} (expected 2 or 3)")
        n_tensors, n_kv = r.unpack("<Q"), r.unpack("<Q")
        if n_tensors > size or n_kv > size:
            raise GGUFError("corrupt GGUF header (impossible tensor or key count)")
        metadata = {}
        for _ in range(n_kv):
            key = r.string()
            metadata[key] = r.value(r.unpack("<I"))
        raw_tensors = []
        for _ in range(n_tensors):
            name = r.string()
            n_dims = r.unpack("<I")
            if n_dims > 8:
                raise GGUFError(f"corrupt GGUF header (tensor {name!r} has {n_dims} dims)")
            shape = tuple(r.unpack("<Q") for _ in range(n_dims))
            raw_tensors.append((name, shape, r.unpack("<I"), r.unpack("<Q")))
        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0:
            alignment = DEFAULT_ALIGNMENT
        data_start = -(-f.tell() // alignment) * alignment
    tensors = []
    for name, shape, type_id, offset in raw_tensors:
        type_name, nbytes = _tensor_bytes(name, shape, type_id)
        if data_start + offset + nbytes > size:
            raise GGUFError(f"truncated GGUF file: tensor {name!r} lies past the end of {path}")
        tensors.append(TensorInfo(name, shape, type_name, offset, nbytes))
    return GGUFHeader(version, metadata, tuple(tensors), data_start)
