"""`launch-cluster`: a router (or several, `--routers`) and N workers on this machine, supervised.

Starts the router(s), then the workers (this machine's cores divided between them), waits until
every worker has registered, prints the URL, and then supervises: a child that dies (a worker or
the router) is restarted at once, with exponential backoff only if it dies again within a
minute. A restarted router starts empty: workers register with it again on their own, and
HTTP requests that were in flight on the dead one are lost (their clients see the connection
close). Ctrl-C / SIGTERM stops the router first (it stops listening and ends open streams
with an error) and then the workers. The children stop themselves if launch-cluster dies,
even by SIGKILL (PDEATHSIG on Linux, and on every platform a watch of the parent pid).
With `--hosts N` it starts N host agents instead of workers (fleet/launch_hosts.py).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fleet.launch_hosts import hosts_problem, serve_hosts
from fleet.supervisor import Child, RankGroup, Supervisor, child_env, cluster_state
from shared.config.choices import DEFAULT_KV_DISK_DIR, DEFAULT_KV_FRACTION, DEFAULT_MODEL_NAME
from shared.config.flags import add_flags, flag_of
from shared.config.fleet import ModelSection, name_clash
from shared.config.sections import ClusterSection, RouterSection, WorkerSection, setting

# [worker] settings launch-cluster passes on to every worker it starts, when typed
WORKER_FLAGS = ("kv_memory", "block_size", "kv_disk", "kv_disk_dir", "speculative")
WORKER_FLAGS += ("attention_backend", "max_running", "prefill_chunk", "kv_bits", "kv_group_size")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="launch-cluster",
        description="Start an mlx-fleet router and N MLX worker processes on this machine.",
        epilog="Example: launch-cluster --workers 2   (then point an OpenAI client at the printed URL)",
    )
    p.add_argument(
        "--config", help="fleet TOML file (deploy/fleet.example.toml); flags override it"
    )
    add_flags(p, ClusterSection, ["workers", "prefill_workers", "tp", "routers"])
    p.add_argument(
        "--model",
        action="append",
        help="model dir, .gguf, HF repo id or gemma3-270m; repeat it to serve several "
        "models, each by its own workers, routed by the request's `model` (default: "
        f"{DEFAULT_MODEL_NAME}, or the --config's [model] / [[models]])",
    )
    add_flags(p, RouterSection, ["host", "port"])
    p.add_argument(
        "--zmq-port",
        type=int,
        help="router's ZeroMQ port on 127.0.0.1, the next ones for --routers (default: free ones)",
    )
    add_flags(p, RouterSection, ["policy", "log_requests", "otlp_endpoint", "kv_pulls"])
    notes = {"kv_memory": "KV budget per worker, e.g. 2GiB (default: 25% of memory / workers)"}
    notes["kv_disk_dir"] = "disk tier folder; each worker uses its own subfolder " + (
        f"(default {DEFAULT_KV_DISK_DIR})"
    )
    each = p.add_argument_group("every worker", "passed on to each worker launch-cluster starts")
    add_flags(each, WorkerSection, WORKER_FLAGS, notes=notes)
    notes = {"kv_events_publish": "KV events in vLLM's format: worker i binds this port + i"}
    add_flags(each, WorkerSection, ["kv_events_publish"], notes=notes)
    p.add_argument("--threads", type=int, help="BLAS threads per worker (default: cores / workers)")
    p.add_argument("--startup-timeout", type=float, default=600, help="seconds to wait for workers")
    p.add_argument(
        "--log-dir", type=Path, help="write each process's log here (default: this terminal)"
    )
    hosts = p.add_argument_group(
        "host agents", "models placed by demand: the routers start workers through host agents"
    )
    hosts.add_argument(
        "--hosts",
        type=int,
        metavar="N",
        help="start N host agents (host-0 ...) instead of workers; the routers load the "
        "--config's [[models]] on them as requests come (needs --config)",
    )
    hosts.add_argument(
        "--host-memory",
        type=size_flag,
        metavar="SIZE",
        help="each host agent's memory budget, e.g. 8GiB (default: 3/4 of memory / N)",
    )
    return p


def size_flag(text: str) -> int:
    from shared.config.fields import Expected, size

    try:
        return size()(text, Path.cwd())
    except Expected as exc:
        raise argparse.ArgumentTypeError(f"expected {exc}") from None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Served:
    """One model of the fleet, resolved: where it is, its names, how many workers serve it."""

    section: ModelSection
    model_dir: Path
    workers: int
    roles: tuple[str, ...] = ()  # one per worker: both, prefill, decode (): all both

    @property
    def name(self) -> str:
        return self.section.name


def routers(args, fleet) -> int:
    return args.routers or fleet.cluster.routers


def commands(
    args, fleet, models: list[Served], zmq_port: int | list[int]
) -> tuple[list[list[str]], list[list[str]]]:
    """(a command per router, a command per worker). Router i listens on the HTTP port + i
    and its ZeroMQ port (`zmq_port` + i when one is given); each worker connects to all."""
    count = routers(args, fleet)
    zmq_ports = [zmq_port + i for i in range(count)] if isinstance(zmq_port, int) else zmq_port
    router_zmq = [f"tcp://127.0.0.1:{port}" for port in zmq_ports]
    py = [sys.executable, "-m"]
    config = ["--config", args.config] if args.config else []
    r = fleet.router
    router = py + ["router", *config, "--host", r.host, "--policy", r.policy]
    if r.log_requests:
        router.append("--log-requests")
    if not r.kv_pulls:  # the file's or --kv-pulls false: the router is told either way
        router += ["--kv-pulls", "false"]
    # traces: --otlp-endpoint (or [router]'s, unless [worker] names its own) goes to all
    router += ["--otlp-endpoint", r.otlp_endpoint] if r.otlp_endpoint else []
    traces = args.otlp_endpoint or (None if fleet.worker.otlp_endpoint else r.otlp_endpoint)
    extra_traces = ["--otlp-endpoint", traces] if traces else []
    for m in models:
        names = ",".join((m.name, *m.section.aliases))
        router += ["--model", str(m.model_dir), "--model-id", names]
    tunables = {
        flag_of(setting(WorkerSection, name)): getattr(args, name)
        for name in WORKER_FLAGS
        if name != "kv_disk_dir"  # each worker gets its own (disk_dir)
    }
    extra = [str(x) for flag, value in tunables.items() if value is not None for x in (flag, value)]
    publish = args.kv_events_publish or fleet.worker.kv_events_publish
    if (
        args.kv_memory is None
        and fleet.worker.kv_memory is None
        and fleet.worker.kv_fraction is None
    ):
        # every rank holds a pool (of its KV heads)
        processes = sum(m.workers for m in models) * fleet.cluster.tp
        extra += ["--kv-fraction", f"{min(0.9, DEFAULT_KV_FRACTION / processes):.4f}"]
    router_cmds = [
        router + ["--port", str(r.port + i), "--zmq-bind", zmq] for i, zmq in enumerate(router_zmq)
    ]
    connect = [x for zmq in router_zmq for x in ("--router", zmq)]
    worker_cmds = []
    for m in models:
        for role in m.roles or ("both",) * m.workers:
            i = len(worker_cmds)
            worker_cmds.append(
                py
                + [
                    "worker",
                    *config,
                    *connect,
                    "--model",
                    str(m.model_dir),
                    "--model-id",
                    m.name,
                    "--worker-id",
                    f"worker-{i}",
                    *extra,
                    *disk_dir(args, fleet, i),
                ]
                + extra_traces
                + (["--role", role] if role != "both" else [])
                + (["--kv-events-publish", offset_port(publish, i)] if publish else [])
            )
    return router_cmds, worker_cmds


def offset_port(endpoint: str, offset: int) -> str:
    """`tcp://host:5557` moved up by `offset` ports (worker i publishes its KV events on port
    + i, as vLLM offsets by data-parallel rank); other transports get a suffix."""
    if offset == 0:
        return endpoint
    if endpoint.startswith("tcp://") and endpoint.rsplit(":", 1)[-1].isdigit():
        base, port = endpoint.rsplit(":", 1)
        return f"{base}:{int(port) + offset}"
    return f"{endpoint}_{offset}"


def worker_roles(args, fleet, workers: int) -> tuple[str, ...]:
    """Each worker's role: [[workers]] entries, else --prefill-workers prefill workers and
    `workers` decode workers, else `workers` that do both."""
    if fleet.workers:
        return tuple(g.role for g in fleet.workers for _ in range(g.count))
    prefill = args.prefill_workers
    prefill = fleet.cluster.prefill_workers if prefill is None else prefill
    if prefill:
        return ("prefill",) * prefill + ("decode",) * workers
    return ("both",) * workers


def disk_dir(args, fleet, worker: int) -> list[str]:
    """Each worker's own disk-tier folder (a restarted worker finds its files again)."""
    if args.kv_disk is None and fleet.worker.kv_disk is None:
        return []
    base = args.kv_disk_dir or fleet.worker.kv_disk_dir or Path(DEFAULT_KV_DISK_DIR).expanduser()
    return ["--kv-disk-dir", str(Path(base) / f"worker-{worker}")]


def worker_child(name: str, cmd: list[str], env: dict, tp: int, log_dir: Path | None):
    """One worker process, or with tp > 1 a group of that many ranks started as one."""
    if tp == 1:
        return Child(name, cmd, env, restart=True, log_dir=log_dir)
    return RankGroup(name, cmd, env, tp, restart=True, log_dir=log_dir)


def tp_problem(model_dir: Path, tp: int, args, fleet) -> str | None:
    """Why the model cannot be served by groups of `tp` ranks (read from config.json before
    any process starts), or None."""
    if tp == 1:
        return None
    if args.kv_disk is not None or fleet.worker.kv_disk is not None:
        return "--kv-disk is not supported with --tp (tensor-parallel groups)"
    from shared.tensor_parallel import GroupError, check_divides

    try:
        check_divides(json.loads((model_dir / "config.json").read_text()), tp)
    except GroupError as exc:
        return f"--tp {tp}: {exc}"
    except (OSError, ValueError) as exc:
        return f"cannot read {model_dir / 'config.json'}: {exc}"
    return None


def wait_until_ready(sup: Supervisor, urls: list[str], workers: int, timeout: float) -> bool:
    """Until every router (router i at urls[i]) has `workers` healthy workers."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline and not sup.stopping:
        sup.poll()
        if sup.router_dead():
            return False
        states = [cluster_state(url) for url in urls]
        for router, state in zip(sup.routers, states, strict=True):
            if state is not None:
                # it came up once: from now on a crash is healed, even before workers are in
                router.restart = True
        healthy = min(sum(w["healthy"] for w in s["workers"]) if s else 0 for s in states)
        if healthy != last:
            print(
                f"[launch-cluster] workers registered: {healthy}/{workers}",
                file=sys.stderr,
                flush=True,
            )
            last = healthy
        if healthy >= workers:
            return True
        time.sleep(0.5)
    return False


def load_settings(parser: argparse.ArgumentParser, argv: list[str] | None):
    from shared.config.fleet import ConfigError, load_with_flags

    renames = {"router": {}, "cluster": {}}
    try:
        return load_with_flags(parser, argv, renames)
    except ConfigError as exc:
        parser.error(str(exc))


def served_models(args, fleet) -> list[Served] | str:
    """Each model of the fleet resolved (GGUFs converted, repo ids fetched: once, before any
    child starts), or why one cannot be."""
    from shared.models.store import (
        ModelNotFound,
        resolve_metadata,
        resolve_section,
        stderr_progress,
    )

    sections = [ModelSection(path=p) for p in args.model] if args.model else fleet.served_models
    if name_clash(sections):
        names = ", ".join(m.name for m in sections)
        return f"two models are named alike ({names}): set [[models]] id in --config"
    models = []
    for m in sections:
        try:
            if args.hosts and m.source:  # the host agents fetch its weights where it loads
                model_dir, _ = resolve_metadata(m, stderr_progress)
            else:
                model_dir = resolve_section(m, stderr_progress)
        except ModelNotFound as exc:
            return str(exc)
        workers = args.workers or m.workers or fleet.cluster.workers  # --workers wins
        if (problem := tp_problem(model_dir, fleet.cluster.tp, args, fleet)) is not None:
            return problem
        roles = worker_roles(args, fleet, workers)
        models.append(Served(m, model_dir, len(roles), roles))
    return models


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, fleet = load_settings(parser, argv)
    if args.hosts is not None and (problem := hosts_problem(args, fleet)):
        parser.error(problem)
    models = served_models(args, fleet)
    if isinstance(models, str):
        print(f"launch-cluster: error: {models}", file=sys.stderr)
        return 2
    workers = sum(m.workers for m in models)
    count = routers(args, fleet)
    zmq_ports = args.zmq_port or [free_port() for _ in range(count)]
    tp = fleet.cluster.tp
    threads = args.threads or max(1, (os.cpu_count() or 1) // (workers * tp))
    router_cmds, worker_cmds = commands(args, fleet, models, zmq_ports)
    urls = [f"http://{fleet.router.host}:{fleet.router.port + i}" for i in range(count)]
    if args.hosts:
        ports = [zmq_ports + i for i in range(count)] if args.zmq_port else zmq_ports
        zmq = [f"tcp://127.0.0.1:{port}" for port in ports]
        return serve_hosts(args, router_cmds, zmq, urls, [m.name for m in models])
    env = child_env(threads)
    sup = Supervisor(
        [
            Child("router" + (f"-{i}" if i else ""), cmd, env, restart=False, log_dir=args.log_dir)
            for i, cmd in enumerate(router_cmds)
        ],
        [
            worker_child(f"worker-{i}", cmd, env, tp, args.log_dir)
            for i, cmd in enumerate(worker_cmds)
        ],
    )
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: sup.request_stop())
    sup.start()
    try:
        if not wait_until_ready(sup, urls, workers, args.startup_timeout):
            if not sup.stopping:
                print(
                    "[launch-cluster] the cluster did not come up; see the logs above",
                    file=sys.stderr,
                )
            return 0 if sup.stopping else 1
        policy = fleet.router.policy
        ranks = f" of {tp} ranks each" if tp > 1 else ""
        if len(models) == 1:
            shape = f"{workers} workers{ranks}"
        else:
            shape = "; ".join(f"{m.name}: {m.workers} workers{ranks}" for m in models)
        names = ", ".join(m.name for m in models)
        at = " and ".join(f"{url}/v1" for url in urls)
        print(f"mlx-fleet is serving {names} at {at} ({shape}, policy {policy})", flush=True)
        return sup.supervise()
    finally:
        sup.shutdown()


if __name__ == "__main__":
    sys.exit(main())
