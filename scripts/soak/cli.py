"""`python scripts/soak.py`: launch-cluster --workers 2 under a mixed open-loop load for a
set duration, with faults on a schedule and the processes sampled; one JSON report on stdout
(or --out), a short summary on stderr; exit 1 when any request was lost or hung."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from scripts.loadgen.services import Service, ServiceSpec, free_port
from scripts.soak.faults import KINDS, Faults, get_json, schedule
from scripts.soak.procs import Sampler
from scripts.soak.traffic import Traffic


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="soak", description=__doc__)
    p.add_argument("--duration", type=float, default=3600, help="seconds of load (3600)")
    p.add_argument("--rate", type=float, default=1.0, help="requests per second, Poisson (1)")
    p.add_argument(
        "--faults",
        default=",".join(KINDS),
        help=f"comma list of {', '.join(KINDS)}, injected in turn; '' for none",
    )
    p.add_argument("--fault-every", type=float, help="seconds between faults (duration / 5)")
    p.add_argument("--stop-seconds", type=float, default=30, help="SIGSTOP length (30)")
    p.add_argument(
        "--fault-worker",
        metavar="ID",
        help="worker faults strike this worker only (e.g. worker-0), so the others live the "
        "whole run and show the memory slope beyond warm-up (default: the first healthy one; "
        "while no healthy worker has this id, a worker fault is skipped and reported so)",
    )
    p.add_argument("--sample-every", type=float, default=5, help="sampling period, s (5)")
    p.add_argument("--deadline", type=float, default=90, help="per-request deadline, s (90)")
    p.add_argument("--max-tokens", type=int, default=24, help="max_tokens per request (24)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--kv-memory", default="512MiB", help="per worker, passed on (512MiB)")
    p.add_argument("--model", help="passed on to launch-cluster (default: its default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-dir", type=Path, help="the cluster's logs (default: a temp dir)")
    p.add_argument("--out", type=Path, help="write the JSON report here too")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    kinds = [k for k in args.faults.split(",") if k]
    if bad := [k for k in kinds if k not in KINDS]:
        print(f"soak: unknown fault {bad[0]!r}; one of {', '.join(KINDS)}", file=sys.stderr)
        return 2
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="soak-"))
    port = free_port()
    argv_ = [
        sys.executable,
        "-m",
        "fleet.launch",
        "--workers",
        str(args.workers),
        "--port",
        str(port),
        "--kv-memory",
        args.kv_memory,
        "--log-dir",
        str(log_dir / "cluster"),
    ]
    argv_ += ["--model", args.model] if args.model else []
    spec = ServiceSpec("launch-cluster", argv_, port, expected_workers=args.workers)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the finally below runs
    service = Service(spec, log_dir / "launch-cluster.log")
    faults = None
    try:
        startup = asyncio.run(service.wait_healthy(600))
        faults = Faults(
            spec.url, "", service.proc.pid, args.workers, args.stop_seconds, args.fault_worker
        )
        report = asyncio.run(soak(args, spec.url, service, faults))
        report["startup_s"] = round(startup, 1)
        report["log_dir"] = str(log_dir)
    finally:
        if faults is not None:
            faults.resume_all()
        service.stop()
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    summary(report)
    return 1 if report["defects"] else 0


async def soak(args, url: str, service: Service, faults: Faults) -> dict:
    async with aiohttp.ClientSession() as session:
        models = await get_json(session, f"{url}/v1/models")
    model = models["data"][0]["id"]
    faults.model = model
    traffic = Traffic(
        url, model, args.rate, args.deadline, args.max_tokens, args.seed, lambda: faults.router_down
    )
    sampler = Sampler(service.proc.pid)
    cluster = ClusterWatch(url)
    start = time.monotonic()
    until = start + args.duration
    plan = schedule(kinds_of(args), args.duration, args.fault_every or args.duration / 5)

    async def sample_loop():
        while time.monotonic() < until:
            await cluster.sample()
            sampler.sample(cluster.memory)
            await asyncio.sleep(args.sample_every)

    async def fault_loop():
        for at, kind in plan:
            await asyncio.sleep(max(0.0, start + at - time.monotonic()))
            await faults.inject(kind, time.monotonic() - start)

    await asyncio.gather(traffic.run(until), sample_loop(), fault_loop())
    tally = traffic.tally.to_json()
    defects = tally["by_outcome"].get("lost", 0) + tally["by_outcome"].get("hung", 0)
    defects += cluster.summary()["kv_check_failures_max"]  # a broken pool is a defect too
    for fault in faults.results:  # the kv-fill burst's own requests count too
        defects += sum(fault.get("outcomes", {}).get(o, 0) for o in ("lost", "hung"))
    return {
        "model": model,
        "duration_s": round(time.monotonic() - start, 1),
        "rate_per_s": args.rate,
        "requests": tally,
        "defects": defects,
        "faults": faults.results,
        "processes": sampler.report(),
        "cluster": cluster.summary(),
    }


MLX_MEMORY = ("mlx_active_mb", "mlx_cache_mb", "prefix_kv_mb")  # the workers' WorkerPhases


def kinds_of(args) -> list[str]:
    return [k for k in args.faults.split(",") if k]


class ClusterWatch:
    """The router's /v1/cluster over time: pending requests, in-flight per worker, health,
    KV use."""

    def __init__(self, url: str):
        self.url = url
        self.samples: list[dict] = []
        self.unreachable = 0
        self.memory: dict[int, dict] = {}  # worker pid -> what its MLX held, last reported

    async def sample(self) -> None:
        async with aiohttp.ClientSession() as session:
            state = await get_json(session, f"{self.url}/v1/cluster")
        if state is None:
            self.unreachable += 1
            return
        workers = state.get("workers", [])
        self.memory = {
            w["pid"]: {k: w["phases"][k] for k in MLX_MEMORY if k in w["phases"]}
            for w in workers
            if w.get("pid") and w.get("phases") and "mlx_active_mb" in w["phases"]
        }
        used = [
            1 - w["kv_free_blocks"] / w["kv_total_blocks"]
            for w in workers
            if w.get("kv_free_blocks") is not None and w.get("kv_total_blocks")
        ]
        self.samples.append(
            {
                "pending": state.get("pending_requests", 0),
                "inflight": sum(w.get("inflight", 0) for w in workers),
                "healthy": sum(bool(w.get("healthy")) for w in workers),
                "kv_used_max": max(used, default=0.0),
                # the workers' own integrity checks of pool and prefix cache (while idle)
                "kv_checks": {w["id"]: w.get("kv_checks", 0) for w in workers},
                "kv_check_failures": sum(w.get("kv_check_failures", 0) for w in workers),
            }
        )

    def summary(self) -> dict:
        s = self.samples
        last = s[-1] if s else {}
        return {
            "samples": len(s),
            "unreachable_samples": self.unreachable,
            "pending_max": max((x["pending"] for x in s), default=None),
            "inflight_max": max((x["inflight"] for x in s), default=None),
            "kv_used_fraction_max": round(max((x["kv_used_max"] for x in s), default=0), 3),
            "healthy_workers_min": min((x["healthy"] for x in s), default=None),
            # a restarted worker counts from 0 again: the most each worker id reached
            "kv_checks": _most_checks(s),
            "kv_check_failures_max": max((x["kv_check_failures"] for x in s), default=0),
            "at_end": last,
        }


def _most_checks(samples: list[dict]) -> dict[str, int]:
    most: dict[str, int] = {}
    for sample in samples:
        for worker, checks in sample["kv_checks"].items():
            most[worker] = max(most.get(worker, 0), checks)
    return most


def summary(report: dict) -> None:
    req = report["requests"]
    lines = [f"soak: {req['total']} requests in {report['duration_s']}s: {req['by_outcome']}"]
    for f in report["faults"]:
        lines.append(f"  fault {f['fault']} at {f['at_s']}s: {f}")
    for p in report["processes"]:
        lines.append(
            f"  {p['role']} {p['pid']}: RSS {p['rss_mb_first']}->{p['rss_mb_last']} MB, "
            f"slope {p['rss_slope_mb_per_hour']} MB/h, fds<={p['open_files_max']}, "
            f"threads<={p['threads_max']}"
        )
        if "host_mb_last" in p:
            lines.append(
                f"    MLX {p['mlx_active_mb_last']} MB active + {p['mlx_cache_mb_last']} "
                f"cached (kept prefixes <= {p['prefix_kv_mb_max']}); the rest (host) "
                f"{p['host_mb_first']}->{p['host_mb_last']} MB, slope "
                f"{p['host_slope_mb_per_hour']} MB/h"
            )
    c = report["cluster"]
    lines.append(
        f"  KV integrity: {sum(c['kv_checks'].values())} checks, "
        f"{c['kv_check_failures_max']} failed"
    )
    verdict = "FAIL" if report["defects"] else "ok"
    lines.append(f"soak: {verdict}: {report['defects']} lost or hung")
    print("\n".join(lines), file=sys.stderr)
