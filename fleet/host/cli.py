"""`mlx-fleet-host` (`python -m fleet.host`): the host agent of one machine."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import tempfile
from pathlib import Path

from fleet.host.agent import AgentSettings, HostAgent
from fleet.host.catalog import Catalog
from fleet.host.links import curve_setup
from fleet.host.memory import default_budget, physical_bytes
from fleet.supervisor import child_env
from shared.config.flags import add_flags
from shared.config.host_section import HostSection
from shared.config.sections import WorkerSection
from shared.parent_watch import watch_parent

HOST_FLAGS = ("host_id", "memory_budget", "threads", "log_dir", "stop_grace_s")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mlx-fleet-host",
        description="The host agent of one machine: it starts and stops the worker processes "
        "the routers place here, for the [[models]] of --config, within a memory budget, and "
        "reports them (their resident memory, and why one ended).",
        epilog="Example: mlx-fleet-host --config fleet.toml --router tcp://10.0.0.1:5555 "
        "(the routers default to [worker] router; CURVE keys are [worker]'s)",
    )
    p.add_argument(
        "--config",
        required=True,
        type=Path,
        help="fleet TOML file: its [[models]] are what this host may serve; [host] sets this "
        "agent, [worker] the routers and CURVE keys (its workers read it too)",
    )
    notes = {
        "router": "a router's ZeroMQ address; repeat it for several (default: [worker] "
        "router, else tcp://127.0.0.1:5555)"
    }
    add_flags(p, WorkerSection, ["router"], notes=notes)
    add_flags(p, HostSection, HOST_FLAGS)
    add_flags(p, WorkerSection, ["log_level"])
    return p


def load_settings(parser: argparse.ArgumentParser, argv: list[str] | None):
    """(args, merged FleetConfig): flags over the file's [host] and [worker]."""
    from shared.config.fleet import ConfigError, load_with_flags
    from shared.curve import CurveError, require_curve

    try:
        args, fleet = load_with_flags(parser, argv, {"host": {}, "worker": {}})
        for router in fleet.worker.router:
            require_curve(router, fleet.worker.curve_enabled, "--router")
        if fleet.worker.kv_fraction is not None or fleet.worker.tp_hosts:
            raise ConfigError(
                "[worker] kv_fraction and tp_hosts do not apply to a host agent's workers: "
                "each gets its model's kv_memory, in one process (remove them from the file "
                "the agent reads)"
            )
    except (ConfigError, CurveError) as exc:
        parser.error(str(exc))
    return args, fleet


def agent_settings(fleet) -> AgentSettings:
    host = fleet.host
    hostname = socket.gethostname()
    log_dir = host.log_dir or Path(tempfile.mkdtemp(prefix="mlx-fleet-host-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    return AgentSettings(
        host_id=host.host_id or hostname.split(".")[0],
        hostname=hostname,
        pid=os.getpid(),
        budget_bytes=host.memory_budget or default_budget(),
        total_bytes=physical_bytes(),
        config=fleet.source,
        routers=fleet.worker.router,
        log_dir=log_dir,
        stop_grace_s=host.stop_grace_s,
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, fleet = load_settings(parser, argv)
    logging.basicConfig(
        level=fleet.worker.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    log = logging.getLogger("fleet.host")
    for client in ("httpx", "httpx2"):  # a line per request of huggingface_hub's fetches
        logging.getLogger(client).setLevel(logging.WARNING)
    settings = agent_settings(fleet)
    threads = fleet.host.threads or max(1, (os.cpu_count() or 1) // 2)
    catalog = Catalog(fleet.served_models)
    agent = HostAgent(settings, catalog, child_env(threads), curve_setup(fleet.worker))
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: agent.request_stop())
    watch_parent()  # started by launch-cluster: go when it goes (macOS has no PDEATHSIG)
    for model in catalog.models:
        if (problem := catalog.problem(model.name)) is not None:
            log.warning("%s will be refused: %s", model.name, problem)
    log.info(
        "host %s: budget %.2f GiB of %.2f GiB, routers %s, worker logs in %s",
        settings.host_id,
        settings.budget_bytes / 2**30,
        settings.total_bytes / 2**30,
        ", ".join(settings.routers),
        settings.log_dir,
    )
    return agent.serve()


if __name__ == "__main__":
    sys.exit(main())
