"""Comparison runner: start each configuration on this machine, wait until it is healthy, run
the same workload(s) against it, stop it; write JSON, a markdown table and PNG plots.

    python scripts/compare.py --configs ours-1,ours-2-cache_aware,mlx_lm --workload multi_tenant \\
        --requests 64 --concurrency 8 --out bench-results/run1
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib.metadata
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from scripts.loadgen.cli import add_load_arguments, load_config
from scripts.loadgen.configs import DEFAULT_CONFIGS, parse_configs, service_spec
from scripts.loadgen.progress import ProgressLine
from scripts.loadgen.report import markdown_table, plot
from scripts.loadgen.rounds import medians, medians_table
from scripts.loadgen.runner import run_load
from scripts.loadgen.services import ROOT, Service, ServiceFailed
from scripts.loadgen.workloads import build
from shared.blas import preload_env


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def python_output(*argv: str) -> str:
    """Last stdout line of `python argv...` run in the repository root (errors: its stderr)."""
    done = subprocess.run(
        [sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"python {shlex.join(argv)} failed:\n{done.stderr[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


def index_suffix(index: str) -> str:
    """A log file per run: "[3/6]" -> "-3"."""
    return "-" + index.strip("[]").split("/")[0]


def roofline_of(model_dir: Path, meta: dict):
    """Measure the machine once; a function giving a run's bound and the fraction reached."""
    from scripts.roofline import Machine, achieved, bound, load_of_report, model_cost
    from shared.models.store import read_config

    say("roofline: measuring this machine's bandwidth and sgemm peak")
    cost = model_cost(read_config(model_dir))
    measured = json.loads(python_output("scripts/roofline.py", "--machine-only"))
    machine_limits = Machine(**measured)
    meta["roofline"] = measured

    def of(report: dict) -> dict:
        limits = bound(load_of_report(report, cost), cost, machine_limits)
        reached = achieved(report, limits)
        kept = ("fraction_of_bound", "fraction_of_shared_bound", "tick_fraction")
        kept += ("decode_tick_p50_ms",)
        return limits | {k: reached[k] for k in kept}

    return of


def default_model_dir() -> Path:
    code = "from shared.models.store import resolve_model; print(resolve_model(None))"
    return Path(python_output("-c", code))


def baseline_env() -> dict[str, str]:
    """The BLAS preloaded for the peers' servers, as our entry points do for themselves (Linux)."""
    env = preload_env()
    return {key: env[key] for key in ("LD_PRELOAD", "MKL_THREADING_LAYER") if env.get(key)}


def machine() -> dict:
    def version(dist: str) -> str | None:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(dist)
        return None

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "mlx": version("mlx"),
        "mlx-lm": version("mlx-lm"),
        "git_commit": commit or None,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }


def write_outputs(out_dir: Path, meta: dict, rows: list[dict]) -> None:
    summary = medians(rows)
    results = {**meta, "medians": summary, "runs": rows}
    (out_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    table = markdown_table(rows)
    header = f"Run of {meta['machine']['date']} on {meta['machine']['platform']}\n\n"
    header += f"`{meta['command']}`\n\n"
    if meta.get("repeats", 1) > 1 or meta.get("roofline"):
        header += (
            "Medians [min-max] over the rounds:\n\n" + medians_table(summary) + "\nEvery run:\n\n"
        )
    (out_dir / "results.md").write_text(header + table)
    if any("failed" not in r for r in rows):
        plot(rows, out_dir)


async def run_configuration(
    args, index: str, spec, workloads: list[str], out_dir: Path, bound=None, round_: int = 1
):
    """Start one configuration, run every workload against it, stop it; its report rows."""
    say(f"{index} {spec.name}: starting: {shlex.join(spec.argv)}")
    service = Service(spec, out_dir / "logs" / f"{spec.name}{index_suffix(index)}.log")
    rows = []
    try:
        took = await service.wait_healthy(args.start_timeout)
        say(f"{index} {spec.name}: healthy after {took:.0f}s at {spec.url}")
        for workload in workloads:
            config = dataclasses.replace(load_config(args, spec.url, spec.model), workload=workload)
            report = await run_load(config, ProgressLine(f"{index} {spec.name} {workload}"))
            if bound is not None:
                report["roofline"] = bound(report)
            rows.append({"config": spec.name, "round": round_, **report})
            print(json.dumps(rows[-1]), flush=True)
    except (ServiceFailed, RuntimeError, aiohttp.ClientError) as e:
        say(f"{index} {spec.name}: FAILED: {e}")
        done = {r["workload"] for r in rows}
        rows += [
            {"config": spec.name, "round": round_, "workload": w, "failed": str(e)}
            for w in workloads
            if w not in done
        ]
    finally:
        say(f"{index} {spec.name}: stopping")
        service.stop()
    return rows


async def compare(args, names: list[str], workloads: list[str], meta: dict) -> list[dict]:
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, asyncio.current_task().cancel)
    model_dir = Path(args.model) if args.model else default_model_dir()
    meta["model_dir"] = str(model_dir)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="mlx-fleet-baseline-") as tmp:
        baseline_dir = Path(args.baseline_model) if args.baseline_model else None
        if {"mlx_lm", "vllm_mlx"} & set(names) and baseline_dir is None:
            say("peers: preparing their model (float32 copy where there is no Metal)")
            out = python_output("-m", "scripts.loadgen.baseline_model", str(model_dir), tmp)
            baseline_dir = Path(out)
        meta["baseline_model_dir"] = str(baseline_dir) if baseline_dir else None
        bound = roofline_of(model_dir, meta) if args.roofline else None
        runs = [(r, name) for r in range(1, args.repeats + 1) for name in names]  # interleaved
        for k, (round_, name) in enumerate(runs, 1):
            spec = service_spec(
                name,
                model_dir,
                baseline_dir or model_dir,
                launch_cmd=args.launch_cmd,
                extra_launch_args=args.launch_args,
                extra_baseline_args=args.baseline_args,
                baseline_env=baseline_env(),
            )
            index = f"[{k}/{len(runs)}]"
            rows += await run_configuration(args, index, spec, workloads, args.out, bound, round_)
            write_outputs(args.out, meta, rows)
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="compare",
        description="Start each configuration, run the same load against it, stop it; "
        "write results.json, results.md and plots into --out.",
    )
    p.add_argument(
        "--configs",
        default=",".join(DEFAULT_CONFIGS),
        help="comma-separated: ours-N, ours-N-POLICY (cache_aware, round_robin, least_load), "
        "mlx_lm, vllm_mlx (after scripts/setup-vllm-mlx) (default: %(default)s)",
    )
    p.add_argument(
        "--out", type=Path, default=Path("bench-results") / time.strftime("%Y%m%d-%H%M%S")
    )
    p.add_argument("--model", help="model directory (default: the project's default model)")
    p.add_argument(
        "--baseline-model",
        help="directory mlx_lm.server serves (default: --model, as float32 where no Metal)",
    )
    p.add_argument(
        "--launch-cmd",
        default=f"{sys.executable} -m fleet.launch",
        help="how to run launch-cluster (default: %(default)s)",
    )
    p.add_argument("--launch-args", default="", help="extra arguments for launch-cluster")
    p.add_argument("--baseline-args", default="", help="extra arguments for mlx_lm.server")
    p.add_argument("--start-timeout", type=float, default=300.0, help="seconds to get healthy")
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="rounds of every configuration, interleaved (A B, A B, ...); results.md then "
        "shows medians and spread, and ratios to the best peer (3+ for a figure you report)",
    )
    p.add_argument(
        "--roofline",
        action="store_true",
        help="measure this machine's bandwidth and sgemm peak first (scripts/roofline.py) and "
        "give every run the fraction of its bound it reached",
    )
    add_load_arguments(p)
    p.set_defaults(warmup=2)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        names = parse_configs(args.configs)
        workloads = [w.strip() for w in args.workload.split(",") if w.strip()]
        for w in workloads:
            build(w, 0, 0)  # checks the name
    except ValueError as e:
        say(f"compare: {e}")
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    command = shlex.join([Path(sys.argv[0]).name, *(sys.argv[1:] if argv is None else argv)])
    meta = {"command": command, "machine": machine(), "configs": names, "workloads": workloads}
    meta["repeats"] = args.repeats
    try:
        rows = asyncio.run(compare(args, names, workloads, meta))
    except (KeyboardInterrupt, asyncio.CancelledError):
        say(
            f"compare: interrupted; every started process was stopped; partial results in {args.out}"
        )
        return 130
    except RuntimeError as e:
        say(f"compare: {e}")
        return 1
    say(f"compare: wrote {args.out}/results.json, results.md and plots")
    return 1 if any("failed" in r or r.get("errors") for r in rows) else 0
