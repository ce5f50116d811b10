"""A bounds-checked reader of a GGUF file's header, run before MLX's loader.

MLX's GGUF reader trusts the file: a header with the right magic and garbage after it
crashes the whole process (segfault). Reading the header here first turns every bad file
into an error message: wrong magic or version, a read past the end, tensor types MLX can't
decode, tensor data that lies outside the file.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from shared.models.gguf.errors import GGUFError

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# ggml type id -> (name, elements per block, bytes per block), for the types MLX decodes.
SUPPORTED_TYPES = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    8: ("Q8_0", 32, 34),
}
_OTHER_TYPES = {6: "Q5_0", 7: "Q5_1", 9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 12: "Q4_K",
                13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 30: "BF16"}  # fmt: skip

# GGUF metadata value types: id -> struct format (None for string / array)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}  # fmt: skip
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    type_name: str
    offset: int
    nbytes: int


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    metadata_keys: tuple[str, ...]
    tensors: tuple[TensorInfo, ...]
    data_start: int


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
            if item_type in _SCALARS:  # skip fixed-size arrays without decoding them
                self.raw(count * struct.calcsize(_SCALARS[item_type]))
                return None
            for _ in range(count):
                self.value(item_type)
            return None
        raise GGUFError(f"corrupt GGUF header (unknown value type {vtype})")


def _tensor_bytes(name: str, shape: tuple[int, ...], type_id: int) -> tuple[str, int]:
    if type_id not in SUPPORTED_TYPES:
        kind = _OTHER_TYPES.get(type_id, f"type {type_id}")
        known = ", ".join(t[0] for t in SUPPORTED_TYPES.values())
        raise GGUFError(f"tensor {name!r} is {kind}; MLX's GGUF loader supports {known}")
    type_name, block, block_bytes = SUPPORTED_TYPES[type_id]
    count = 1
    for d in shape:
        count *= d
    if count % block:
        raise GGUFError(f"tensor {name!r} has {count} values, not a multiple of {block}")
    return type_name, count // block * block_bytes


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
        keys, alignment = [], DEFAULT_ALIGNMENT
        for _ in range(n_kv):
            key = r.string()
            value = r.value(r.unpack("<I"))
            if key == "general.alignment" and isinstance(value, int) and value > 0:
                alignment = value
            keys.append(key)
        raw_tensors = []
        for _ in range(n_tensors):
            name = r.string()
            n_dims = r.unpack("<I")
            if n_dims > 8:
                raise GGUFError(f"corrupt GGUF header (tensor {name!r} has {n_dims} dims)")
            shape = tuple(r.unpack("<Q") for _ in range(n_dims))
            raw_tensors.append((name, shape, r.unpack("<I"), r.unpack("<Q")))
        data_start = -(-f.tell() // alignment) * alignment
    tensors = []
    for name, shape, type_id, offset in raw_tensors:
        type_name, nbytes = _tensor_bytes(name, shape, type_id)
        if data_start + offset + nbytes > size:
            raise GGUFError(f"truncated GGUF file: tensor {name!r} lies past the end of {path}")
        tensors.append(TensorInfo(name, shape, type_name, offset, nbytes))
    return GGUFHeader(version, tuple(keys), tuple(tensors), data_start)
