"""A SIMT emulator for `mx.fast.metal_kernel` bodies: compile the exact body string with g++
against a C++ shim of the Metal names (metal_shim.h), run it thread by thread (driver.h), and
exchange buffers through numpy.

    kernel = EmulatedKernel(name, input_names, output_names, source, header=...)
    outputs = kernel(inputs=[...], template=[...], grid=..., threadgroup=...,
                     output_shapes=[...], output_dtypes=[...])

takes the same call arguments as the callable `mx.fast.metal_kernel` returns and gives back
mx arrays. Each call also asks MLX for the source it would generate (`mlx_source`) and refuses
to run if our mirror of that source (`signature`) differs by a byte. Built libraries are cached by a hash of their source (EMULATOR_CACHE_DIR or a
directory under the system temp dir), so a pipeline compiles once per machine.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import mlx.core as mx
import numpy as np

from tests.support.metal_emulator import signature
from tests.support.metal_emulator.mlx_source import source_from_mlx

HERE = Path(__file__).parent
COMPILE_FLAGS = ["-std=c++20", "-O1", "-pthread", "-shared", "-fPIC", "-Wno-attributes"]
_STORAGE = {mx.bfloat16: (mx.uint16, np.uint16)}
_NUMPY = {
    mx.float32: np.float32,
    mx.float16: np.float16,
    mx.int32: np.int32,
    mx.uint32: np.uint32,
    mx.int64: np.int64,
    mx.bool_: np.bool_,
}
_LIBRARIES: dict[str, ctypes.CDLL] = {}
MAX_THREADS_PER_THREADGROUP = 1024  # Apple GPUs; a pipeline may allow fewer


class SignatureMismatch(AssertionError):
    """Our mirror of MLX's generated source differs from what MLX generated: the emulator
    would compile something other than what a Mac compiles, so it refuses to run."""

    def __init__(self, ours: str, mlx_text: str):
        import difflib

        diff = difflib.unified_diff(mlx_text.splitlines(), ours.splitlines(), "mlx", "emulator")
        super().__init__("emulator source differs from MLX's:\n" + "\n".join(diff))


class EmulatorUnavailable(RuntimeError):
    """No C++20 compiler here."""


def compiler() -> str:
    found = shutil.which(os.environ.get("CXX", "g++"))
    if found is None:
        raise EmulatorUnavailable("no g++ on PATH (scripts/setup installs it)")
    return found


def require_compiler() -> None:
    """Skip the calling test module where there is no g++, except in CI (env CI set), where
    a missing compiler must fail rather than quietly skip the kernel's verification."""
    import pytest

    try:
        compiler()
    except EmulatorUnavailable as error:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"SIMT emulator unavailable: {error}", allow_module_level=True)


def cache_dir() -> Path:
    default = Path(tempfile.gettempdir()) / "mlx-fleet-metal-emulator"
    path = Path(os.environ.get("EMULATOR_CACHE_DIR", default))
    path.mkdir(parents=True, exist_ok=True)
    return path


def build(source: str) -> ctypes.CDLL:
    """Compile (or reuse) a shared library of `source`, with the shim and driver included."""
    headers = "".join(
        (HERE / f).read_text() for f in ("metal_shim.h", "driver.h", "metal_qualifiers.h")
    )
    key = hashlib.sha256("\0".join([source, headers, *COMPILE_FLAGS]).encode()).hexdigest()[:24]
    if key in _LIBRARIES:
        return _LIBRARIES[key]
    library = cache_dir() / f"kernel-{key}.so"
    if not library.exists():
        _compile(source, library)
    _LIBRARIES[key] = ctypes.CDLL(str(library))
    return _LIBRARIES[key]


def _compile(source: str, library: Path) -> None:
    with tempfile.TemporaryDirectory(dir=library.parent) as work:
        cpp = Path(work) / "kernel.cpp"
        cpp.write_text('#include "driver.h"\n' + source)
        built = Path(work) / "kernel.so"
        command = [compiler(), *COMPILE_FLAGS, f"-I{HERE}", str(cpp), "-o", str(built)]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"emulated kernel failed to compile:\n{result.stderr[-4000:]}")
        os.replace(built, library)  # atomic: parallel builders never see half a library


def to_numpy(array: mx.array) -> np.ndarray:
    if array.dtype in _STORAGE:
        array = array.view(_STORAGE[array.dtype][0])
    return np.ascontiguousarray(np.array(array))


def from_numpy(values: np.ndarray, dtype) -> mx.array:
    out = mx.array(values)
    return out.view(dtype) if dtype in _STORAGE else out


def empty_output(shape, dtype) -> np.ndarray:
    storage = _STORAGE[dtype][1] if dtype in _STORAGE else _NUMPY[dtype]
    return np.zeros(shape, dtype=storage)


class EmulatedKernel:
    """Stands in for `mx.fast.metal_kernel(...)`; see the module docstring."""

    def __init__(self, name, input_names, output_names, source, header="", **_ignored):
        self.name, self.source, self.header = name, source, header
        self.input_names, self.output_names = list(input_names), list(output_names)
        self.last_source: str | None = None  # the Metal source of the latest call
        self.checked_against_mlx = False  # was it identical to what MLX itself generated?

    def __call__(
        self,
        *,
        inputs,
        template=(),
        grid,
        threadgroup,
        output_shapes,
        output_dtypes,
        stagger_us: int = 0,
        **_ignored,
    ) -> list[mx.array]:
        inputs = [x if isinstance(x, mx.array) else mx.array(x) for x in inputs]
        threads = threadgroup[0] * threadgroup[1] * threadgroup[2]
        if threads > MAX_THREADS_PER_THREADGROUP:
            raise ValueError(f"threadgroup of {threads} threads: Metal allows at most 1024")
        metal, slots, attributes = signature.kernel_source(
            self.name,
            self.input_names,
            self.output_names,
            self.source,
            self.header,
            inputs,
            output_dtypes,
            list(template),
        )
        from_mlx = source_from_mlx(
            self.name,
            self.input_names,
            self.output_names,
            self.source,
            self.header,
            dict(
                inputs=inputs,
                template=list(template),
                grid=grid,
                threadgroup=threadgroup,
                output_shapes=output_shapes,
                output_dtypes=output_dtypes,
            ),
        )
        if from_mlx is not None and from_mlx != metal:
            raise SignatureMismatch(metal, from_mlx)
        self.last_source, self.checked_against_mlx = metal, from_mlx is not None
        func = signature.kernel_name(self.name, inputs, output_dtypes, list(template))
        entry = signature.entry_source(func, slots, output_dtypes, attributes, template)
        library = build(metal + entry)
        buffers = [_slot_buffer(slot, inputs[slot.input_index]) for slot in slots]
        outputs = [empty_output(s, d) for s, d in zip(output_shapes, output_dtypes, strict=True)]
        pointers = (ctypes.c_void_p * (len(buffers) + len(outputs)))(
            *[b.ctypes.data for b in buffers + outputs]
        )
        library.emu_run(
            pointers, (ctypes.c_int * 3)(*grid), (ctypes.c_int * 3)(*threadgroup), stagger_us
        )
        return [from_numpy(o, d) for o, d in zip(outputs, output_dtypes, strict=True)]


def _slot_buffer(slot: signature.InputSlot, array: mx.array) -> np.ndarray:
    if slot.kind in ("array", "scalar"):
        return to_numpy(array)
    if slot.kind == "shape":
        return np.array(array.shape, dtype=np.int32)
    if slot.kind == "strides":
        strides, step = [], 1
        for size in reversed(array.shape):
            strides.append(step)
            step *= size
        return np.array(strides[::-1], dtype=np.int64)
    return np.array(array.ndim, dtype=np.int32)
