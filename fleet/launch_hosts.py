"""`launch-cluster --hosts N`: the router(s) and N host agents on this machine (host-0 ..
host-N-1), each with its share of the memory as its budget; the routers place the config's
[[models]] on them by demand (router/placement/), so no worker starts here up front.

launch-cluster supervises the agents as it does workers (a dead one is restarted; its
workers died with it), and is ready once every router answers /v1/cluster."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from fleet.host.memory import default_budget
from fleet.supervisor import Child, Supervisor, child_env, cluster_state, say
from shared.placement.footprint import gib


def hosts_problem(args, fleet) -> str | None:
    """Why `--hosts` cannot go with the other settings given, or None."""
    if args.hosts < 1 or not args.config:
        return "--hosts N needs N >= 1 and --config (the [[models]] the agents serve)"
    if fleet.cluster.tp > 1:
        return (
            "--hosts with --tp: host agents start one-process workers; start a tensor-parallel "
            "group with launch-cluster --tp (no --hosts) or by hand (docs/deploy.md)"
        )
    if args.workers or args.prefill_workers or fleet.workers:
        return (
            "--hosts starts workers by demand: set [[models]] min_workers / max_workers "
            "instead of --workers, --prefill-workers or [[workers]]"
        )
    return None


def agent_commands(args, zmq_endpoints: list[str], budget: int) -> list[list[str]]:
    """One `python -m fleet.host` per host, each connected to every router."""
    connect = [x for endpoint in zmq_endpoints for x in ("--router", endpoint)]
    threads = args.threads or max(1, (os.cpu_count() or 1) // (2 * args.hosts))
    commands = []
    for i in range(args.hosts):
        cmd = [sys.executable, "-m", "fleet.host", "--config", str(args.config), *connect]
        cmd += ["--host-id", f"host-{i}", "--memory-budget", str(budget)]
        cmd += ["--threads", str(threads)]
        cmd += ["--log-dir", str(Path(args.log_dir) / "workers")] if args.log_dir else []
        commands.append(cmd)
    return commands


def host_budget(args) -> int:
    """Each agent's budget: --host-memory, else this machine's budget shared by the agents."""
    return args.host_memory or default_budget() // args.hosts


def serve_hosts(args, router_cmds: list[list[str]], zmq_endpoints, urls, names) -> int:
    """Start the routers and the agents, wait for the routers, then supervise until stopped."""
    budget = host_budget(args)
    env = child_env(1)  # the agents give their workers their own thread count
    routers = [
        Child("router" + (f"-{i}" if i else ""), cmd, env, restart=False, log_dir=args.log_dir)
        for i, cmd in enumerate(router_cmds)
    ]
    agents = [
        Child(f"host-{i}", cmd, env, restart=True, log_dir=args.log_dir)
        for i, cmd in enumerate(agent_commands(args, zmq_endpoints, budget))
    ]
    sup = Supervisor(routers, agents)
    install_stop(sup)
    sup.start()
    try:
        deadline = time.monotonic() + args.startup_timeout
        while not all(cluster_state(url) is not None for url in urls):
            sup.poll()
            if sup.stopping or sup.router_dead() or time.monotonic() > deadline:
                if not sup.stopping:
                    say("the router did not come up; see the logs above")
                return 0 if sup.stopping else 1
            time.sleep(0.3)
        at = " and ".join(f"{url}/v1" for url in urls)
        shape = f"{args.hosts} host agents of {gib(budget)} each, models load on demand"
        print(f"mlx-fleet is serving {', '.join(names)} at {at} ({shape})", flush=True)
        return sup.supervise()
    finally:
        sup.shutdown()


def install_stop(sup: Supervisor) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: sup.request_stop())
