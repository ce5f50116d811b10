"""The [host] section: the host agent of a machine (fleet/host/), which starts and stops the
workers the routers place on it (see shared/config/sections.py for how settings are declared)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from shared.config.fields import integer, number, path, size, spec, string


@dataclass(frozen=True)
class HostSection:
    host_id: str | None = spec(
        None, string(optional=True), "this host's name to the routers (default: the hostname)"
    )
    memory_budget: int | None = spec(
        None,
        size(),
        "memory this host's workers may take together, by their estimates, e.g. 48GiB "
        "(default: 3/4 of the machine's memory)",
    )
    threads: int | None = spec(
        None, integer(1, optional=True), "BLAS threads per worker (default: cores / 2)"
    )
    log_dir: Path | None = spec(
        None, path(), "folder of its workers' logs, WORKER_ID.log (default: a temporary folder)"
    )
    stop_grace_s: float = spec(
        10.0,
        number(0.0),
        "seconds a stopped worker has to exit after SIGTERM before it is killed",
        flag="--stop-grace",
    )
