"""The Metal source MLX itself generates for a kernel call, obtained without Metal.

Without a Metal back-end `mx.fast.metal_kernel` refuses to run, but while a function is being
exported (`mx.export_function`) it still builds the call, and with `verbose=True` prints the
full generated source (signature included) to the C++ stdout. We capture that at the file
descriptor level. Older MLX versions refuse even then: `None`.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile

import mlx.core as mx

_FENCED = re.compile(r"```\n(.*?)\n```", re.DOTALL)


def source_from_mlx(name, input_names, output_names, body, header, call: dict) -> str | None:
    kernel = mx.fast.metal_kernel(name, input_names, output_names, body, header=header)
    inputs = [x if isinstance(x, mx.array) else mx.array(x) for x in call["inputs"]]
    options = {k: v for k, v in call.items() if k != "inputs"}

    def traced(*arrays):
        return kernel(inputs=list(arrays), verbose=True, **options)

    with tempfile.TemporaryDirectory() as work:
        try:
            printed = _captured_stdout(
                lambda: mx.export_function(os.path.join(work, "k.mlxfn"), traced, *inputs)
            )
        except (RuntimeError, ValueError):
            return None
    found = _FENCED.search(printed)
    return found.group(1) if found else None


def _captured_stdout(action) -> str:
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 1)
        try:
            action()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        sink.seek(0)
        return sink.read().decode(errors="replace")
