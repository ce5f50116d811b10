#!/usr/bin/env python
"""Print a report to paste into an issue: this machine, the Metal paged-attention kernel's
self-test, kernel vs MLX-ops timings, and (optionally) the engine and cluster benchmarks.

Usage: scripts/mac-check [--quick] [--skip-engine] [--skip-cluster] [--help]
Runs anywhere; where there is no Metal the kernel columns say why. Format: docs/mac-check.md.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from shared.blas import reexec_with_blas  # noqa: E402

FULL = dict(batches=[1, 8, 32, 64], contexts=[512, 2048, 8192], block_sizes=[8, 16, 32])
QUICK = dict(batches=[1, 8], contexts=[512], block_sizes=[16])
SECTIONS = ("Machine", "Kernel self-test", "Kernel vs MLX ops", "Engine benchmark", "Cluster")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a small microbenchmark grid")
    p.add_argument("--skip-engine", action="store_true", help="skip scripts/bench_engine.py")
    p.add_argument("--skip-cluster", action="store_true", help="skip scripts/compare.py")
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    p.add_argument("--heads", type=int, default=32, help="query heads of the benchmark shape")
    p.add_argument("--kv-heads", type=int, default=8, help="KV heads of the benchmark shape")
    p.add_argument("--head-dim", type=int, default=128, choices=[64, 128])
    p.add_argument("--repeats", type=int, default=5, help="timed runs per cell (median)")
    p.add_argument(
        "--kv-bits",
        default="16,8,4",
        help="K/V layouts to test and time: 16 (the dtype), 8, 4 (default: %(default)s)",
    )
    p.add_argument("--kv-group-size", type=int, default=64, choices=[32, 64, 128])
    p.add_argument(
        "--compare-args",
        default="--configs ours-1,mlx_lm",
        help="arguments for scripts/compare.py (default: %(default)s)",
    )
    return p.parse_args(argv)


def version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def chip() -> str:
    if sys.platform != "darwin":
        return platform.processor() or platform.machine()
    out = subprocess.run(
        ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True
    )
    return out.stdout.strip() or platform.machine()


def machine_section() -> list[str]:
    import mlx.core as mx

    from worker.attention.metal import kernel as metal_kernel

    metal = metal_kernel.metal_reason()
    lines = [
        f"- machine: {platform.machine()}, {chip()}",
        f"- OS: {platform.platform()}",
        f"- Python: {platform.python_version()}",
        f"- MLX: {version('mlx')}; mlx-lm: {version('mlx-lm')}",
        f"- Metal available: {'yes' if metal is None else 'no'}",
    ]
    if metal is None:
        info = mx.metal.device_info()
        lines.append(
            f"- GPU: {info.get('architecture', '?')}, memory {info.get('memory_size', '?')}"
        )
    return lines


def kv_layouts(args) -> list[tuple[str, object]]:
    """(label, quantizer or None) per --kv-bits entry: "float16", "q8g64", ..."""
    from worker.kv.quant import QuantizedKV

    def quantizer(bits):
        def quantize(values):
            out = QuantizedKV.zeros(
                *values.shape, bits=bits, group_size=args.kv_group_size, dtype=values.dtype
            )
            out[mx.arange(values.shape[0])] = values
            return out

        return quantize

    import mlx.core as mx

    bits = [int(b) for b in args.kv_bits.split(",")]
    return [
        (args.dtype, None) if b >= 16 else (f"q{b}g{args.kv_group_size}", quantizer(b))
        for b in bits
    ]


def self_test_section(args, dtype, shape) -> list[str]:
    from worker.attention import selftest
    from worker.attention.metal import kernel as metal_kernel

    lines = [
        "| KV | block size | dtype | ok | kernel ms | MLX ops ms | max error | reason |",
        "|---|---|---|---|---|---|---|---|",
    ]
    picks = []
    for label, quantize in kv_layouts(args):
        for block_size in FULL["block_sizes"]:
            result = selftest.verify_metal_backend(
                block_size=block_size,
                dtype=dtype,
                repeats=args.repeats,
                quantize=quantize,
                **shape,
            )
            lines.append(
                f"| {label} | {block_size} | {args.dtype} | {'yes' if result.ok else 'no'} | "
                f"{_ms(result.candidate_ms)} | {_ms(result.reference_ms)} | "
                f"{_err(result.max_error)} | {result.reason} |"
            )
        reason = metal_kernel.unavailable_reason()
        picks.append(
            f'backend "auto" picks ({label}): {"metal" if reason is None else "mlx"}'
            + ("" if reason is None else f" ({reason})")
        )
    return [*lines, "", *picks, "", *variants_table(args, dtype, shape)]


def variants_table(args, dtype, shape) -> list[str]:
    """Split-K and prefix-grouped, each self-tested on the shape it is for (split: one
    4096-token row; grouped: 8 rows of 2 tenants sharing 1024 tokens) and timed against the
    plain kernel, and the window and sink features (correctness only): a worker uses a variant
    only where its row says yes."""
    from worker.attention import selftest

    lines = [
        "Kernel variants (each against MLX ops for correctness, split and grouped timed "
        "against the plain kernel on their own shapes):",
        "",
        "| KV | block size | variant | ok | variant ms | plain kernel ms | max error | reason |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, quantize in kv_layouts(args):
        for block_size in FULL["block_sizes"]:
            results = selftest.verify_metal_variants(
                block_size=block_size,
                dtype=dtype,
                repeats=args.repeats,
                quantize=quantize,
                **shape,
            )
            for variant, result in results.items():
                lines.append(
                    f"| {label} | {block_size} | {variant} | {'yes' if result.ok else 'no'} | "
                    f"{_ms(result.candidate_ms)} | {_ms(result.reference_ms)} | "
                    f"{_err(result.max_error)} | {result.reason} |"
                )
    return lines


def microbench_section(args, dtype, shape) -> list[str]:
    from worker.attention.metal import kernel as metal_kernel
    from worker.attention.paged import BACKENDS, AttentionBackend
    from worker.attention.selftest import median_ms, plan_call, random_decode_batch

    grid = QUICK if args.quick else FULL
    metal_missing = metal_kernel.metal_reason()
    kernel = AttentionBackend("metal", metal_kernel.paged_attention_metal, lambda: None)
    lines = [
        "| KV | batch | context | block size | Metal kernel ms | MLX ops ms | speedup |",
        "|---|---|---|---|---|---|---|",
    ]
    cells = [
        (label, quantize, batch, context, block_size)
        for label, quantize in kv_layouts(args)
        for batch in grid["batches"]
        for context in grid["contexts"]
        for block_size in grid["block_sizes"]
    ]
    for label, quantize, batch, context, block_size in cells:
        inputs = random_decode_batch(
            batch=batch,
            context=context,
            block_size=block_size,
            dtype=dtype,
            quantize=quantize,
            **shape,
        )
        mlx_ms = median_ms(plan_call(BACKENDS["mlx"], inputs, block_size), args.repeats)
        if metal_missing is not None:
            metal_cell, speedup = "unavailable", "-"
        else:
            metal_cell, speedup = _time_kernel(kernel, inputs, block_size, args, mlx_ms)
        lines.append(
            f"| {label} | {batch} | {context} | {block_size} | {metal_cell} | {mlx_ms:.3f} "
            f"| {speedup} |"
        )
    if metal_missing is not None:
        lines += ["", f"Metal kernel: unavailable ({metal_missing}); MLX ops ran on the CPU."]
    return lines


def _time_kernel(kernel, inputs, block_size, args, mlx_ms) -> tuple[str, str]:
    from worker.attention.selftest import median_ms, plan_call

    try:
        metal_ms = median_ms(plan_call(kernel, inputs, block_size), args.repeats)
    except Exception as error:  # a cell's failure is reported, the report goes on
        return f"error: {type(error).__name__}: {error}", "-"
    return f"{metal_ms:.3f}", f"{mlx_ms / metal_ms:.2f}x"


def script_section(command: list[str], skipped: bool, flag: str) -> list[str]:
    if skipped:
        return [f"skipped ({flag})"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    output = (result.stdout + result.stderr).strip().splitlines()[-60:]
    return [f"`{' '.join(command[1:])}` exit {result.returncode}", "```", *output, "```"]


def cluster_command(args) -> list[str]:
    out = Path(tempfile.mkdtemp(prefix="mac-check-compare-"))
    return [sys.executable, "scripts/compare.py", *args.compare_args.split(), "--out", str(out)]


def engine_command(args) -> list[str]:
    quick = ["--batch-sizes", "1,8", "--max-tokens", "16", "--skip", "prefix"] if args.quick else []
    return [sys.executable, "scripts/bench_engine.py", *quick]


def _ms(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def _err(value) -> str:
    return "-" if value is None else f"{value:.2e}"


def main(argv=None) -> int:
    args = parse_args(argv)
    reexec_with_blas()
    import mlx.core as mx

    dtype = getattr(mx, args.dtype)
    shape = dict(num_heads=args.heads, num_kv_heads=args.kv_heads, head_dim=args.head_dim)
    title = f"decode, {args.heads} heads / {args.kv_heads} KV heads, head dim {args.head_dim}"
    bodies = {
        "Machine": lambda: machine_section(),
        "Kernel self-test": lambda: self_test_section(args, dtype, shape),
        "Kernel vs MLX ops": lambda: microbench_section(args, dtype, shape),
        "Engine benchmark": lambda: script_section(
            engine_command(args), args.skip_engine, "--skip-engine"
        ),
        "Cluster": lambda: script_section(
            cluster_command(args), args.skip_cluster, "--skip-cluster"
        ),
    }
    print(f"# mlx-fleet mac-check ({title}, {args.dtype}{', quick' if args.quick else ''})")
    for name in SECTIONS:
        print(f"\n## {name}\n", flush=True)
        print("\n".join(bodies[name]()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
