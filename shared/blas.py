"""Use the system's OpenBLAS for MLX's CPU matmuls on Linux.

The `mlx-cpu` wheel bundles a reference BLAS: a 66x576x576 float32 matmul ran at 5.7 GFLOP/s
here, 127 GFLOP/s with Debian's `libopenblas0-pthread` preloaded. The dynamic loader only
honours LD_PRELOAD at process start, so an entry point calls `reexec_with_openblas()` first
thing: if OpenBLAS is present and not yet preloaded, the process re-executes itself with
LD_PRELOAD set (children inherit it). `MLX_FLEET_OPENBLAS=0` turns this off;
`MLX_FLEET_OPENBLAS=/path/libblas.so.3` picks another library.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

ENV_SWITCH = "MLX_FLEET_OPENBLAS"
CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libblas.so.3",
)


def openblas_path(env: Mapping[str, str] | None = None) -> str | None:
    """The OpenBLAS library to preload, or None (off, not Linux, or not installed)."""
    choice = (os.environ if env is None else env).get(ENV_SWITCH, "1")
    if choice.lower() in ("0", "off", "false", "no") or not sys.platform.startswith("linux"):
        return None
    candidates = (choice,) if choice not in ("1", "on", "true", "yes") else CANDIDATES
    return next((c for c in candidates if Path(c).is_file()), None)


def preload_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of `env` with OpenBLAS added to LD_PRELOAD (when it applies)."""
    env = dict(os.environ if env is None else env)
    lib = openblas_path(env)
    preload = env.get("LD_PRELOAD", "")
    if lib and lib not in preload.split(":"):
        env["LD_PRELOAD"] = f"{lib}:{preload}" if preload else lib
    return env


def openblas_active() -> bool:
    lib = openblas_path()
    return bool(lib) and lib in os.environ.get("LD_PRELOAD", "").split(":")


def reexec_with_openblas() -> None:
    """Re-execute this process with OpenBLAS preloaded, unless it already is or shouldn't be.

    Call before importing mlx. Uses `sys.orig_argv`, so `python -m pkg` keeps working.
    """
    lib = openblas_path()
    if not lib or openblas_active() or os.environ.get("_MLX_FLEET_REEXECED"):
        return
    env = preload_env()
    env["_MLX_FLEET_REEXECED"] = "1"  # never loop, even if the loader ignores the preload
    argv = list(getattr(sys, "orig_argv", [sys.executable, *sys.argv]))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *argv[1:]], env)
