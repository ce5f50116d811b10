"""A fast BLAS under MLX's CPU matmuls on Linux.

The `mlx-cpu` wheel bundles a reference BLAS: a 66x576x576 float32 matmul ran at 5.7 GFLOP/s
here. The dynamic loader only honours LD_PRELOAD at process start, so an entry point calls
`reexec_with_blas()` first thing: if a better library is present and not yet preloaded, the
process re-executes itself with LD_PRELOAD set (children inherit it). In order of preference:

- Intel oneMKL on Intel CPUs, from the `mkl` wheel (a dependency on x86-64 Linux, in
  `.venv/lib`; on other vendors' CPUs it is not measured, so OpenBLAS stays first). Decode
  matmuls here (8 rows x 576 x 1536, the default model's MLP) stream their weights at 12.4
  GB/s against OpenBLAS's 8.6, and a batch-8 decode forward of the default model takes 88 ms
  against 109 (`scripts/profile_forward.py`). Its threads come from Intel's OpenMP runtime,
  whose default spin after a parallel region is what makes it fast (KMP_BLOCKTIME=0 gave the
  gain back); OpenBLAS's threads spin the same way.
- Debian's OpenBLAS (`libopenblas0-pthread`): 127 GFLOP/s on the matmul above.

`MLX_FLEET_BLAS`: unset or `1`: the first of those that applies; `mkl` or `openblas`: that one;
`0`: none (MLX's own); a path: that library. `MLX_FLEET_OPENBLAS`, its older name, is read
when `MLX_FLEET_BLAS` is unset.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping
from pathlib import Path

ENV_SWITCH = "MLX_FLEET_BLAS"
OLD_ENV_SWITCH = "MLX_FLEET_OPENBLAS"
OPENBLAS = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libblas.so.3",
)
OFF = ("0", "off", "false", "no")
AUTO = ("1", "on", "true", "yes", "auto")


def intel_cpu() -> bool:
    try:
        return "GenuineIntel" in Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return False


def mkl_path() -> Path | None:
    """oneMKL's single dynamic library in this interpreter's environment, where it applies."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    lib = Path(sys.prefix) / "lib" / "libmkl_rt.so.3"
    return lib if lib.is_file() else None


def blas_path(env: Mapping[str, str] | None = None) -> str | None:
    """The BLAS library to preload, or None (off, not Linux, or none installed)."""
    env = os.environ if env is None else env
    raw = env.get(ENV_SWITCH, env.get(OLD_ENV_SWITCH, "1"))
    choice = raw.lower()
    if choice in OFF or not sys.platform.startswith("linux"):
        return None
    mkl = mkl_path()
    candidates: tuple[str, ...]
    if choice in AUTO:
        candidates = ((str(mkl),) if mkl and intel_cpu() else ()) + OPENBLAS
    elif choice == "mkl":
        candidates = (str(mkl),) if mkl else ()
    elif choice == "openblas":
        candidates = OPENBLAS
    else:
        candidates = (raw,)
    return next((c for c in candidates if Path(c).is_file()), None)


def blas_name(env: Mapping[str, str] | None = None) -> str:
    """ "mkl", "openblas", another library's file name, or "off": for start-up logs."""
    lib = blas_path(env)
    if lib is None:
        return "off"
    if Path(lib).name.startswith("libmkl"):
        return "mkl"
    return "openblas" if lib in OPENBLAS else Path(lib).name


def preload_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of `env` with the BLAS added to LD_PRELOAD (when it applies)."""
    env = dict(os.environ if env is None else env)
    lib = blas_path(env)
    preload = env.get("LD_PRELOAD", "")
    if lib and lib not in preload.split(":"):
        env["LD_PRELOAD"] = f"{lib}:{preload}" if preload else lib
    if lib and Path(lib).name.startswith("libmkl"):
        env.setdefault("MKL_THREADING_LAYER", "INTEL")  # Intel's OpenMP, shipped beside it
    return env


def blas_active() -> bool:
    lib = blas_path()
    return bool(lib) and lib in os.environ.get("LD_PRELOAD", "").split(":")


def active_blas() -> str:
    """The preloaded BLAS's name (`blas_name`), or "off" where none is: for start-up logs."""
    return blas_name() if blas_active() else "off"


def reexec_with_blas() -> None:
    """Re-execute this process with the BLAS preloaded, unless it already is or shouldn't be.

    Call before importing mlx. Uses `sys.orig_argv`, so `python -m pkg` keeps working.
    """
    lib = blas_path()
    if not lib or blas_active() or os.environ.get("_MLX_FLEET_REEXECED"):
        return
    env = preload_env()
    env["_MLX_FLEET_REEXECED"] = "1"  # never loop, even if the loader ignores the preload
    argv = list(getattr(sys, "orig_argv", [sys.executable, *sys.argv]))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *argv[1:]], env)
