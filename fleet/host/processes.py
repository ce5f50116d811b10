"""One worker process of a host agent: started from the config's [[models]] entry, its output
in a log file (whose last lines explain a failure), stopped with SIGTERM, then SIGKILL.

The process is a fleet/supervisor.py `Child` (not restarted: the router decides what runs
where): it dies with the agent, even by SIGKILL (PDEATHSIG on Linux, and the parent watch of
shared/parent_watch.py the worker runs on every platform)."""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fleet.supervisor import Child
from shared.placement.messages import HostWorker, StartWorker, WorkerExited

LOG_TAIL_LINES = 6  # of a failed worker's log, in WorkerExited.reason
LOG_TAIL_CHARS = 2000


def worker_command(
    config: Path, start: StartWorker, routers: tuple[str, ...], worker_id: str
) -> list[str]:
    """`python -m worker` for catalog model `start.model` (its path read from the config)."""
    connect = [x for endpoint in routers for x in ("--router", endpoint)]
    return [
        sys.executable,
        "-m",
        "worker",
        "--config",
        str(config),
        "--model-id",
        start.model,
        "--worker-id",
        worker_id,
        "--kv-memory",
        str(start.kv_memory_bytes),
        *connect,
    ]


@dataclass
class WorkerProcess:
    start: StartWorker
    child: Child
    log_offset: int = 0  # where this run's lines begin in its log (a reused id appends)
    stop_reason: str | None = None  # set by StopWorker: its exit is not a failure
    kill_at: float | None = None

    @classmethod
    def launch(cls, start: StartWorker, cmd: list[str], env: dict, log_dir: Path):
        child = Child(start.worker_id, cmd, env, restart=False, log_dir=log_dir)
        log = log_dir / f"{start.worker_id}.log"
        offset = log.stat().st_size if log.exists() else 0
        child.start()
        return cls(start, child, offset)

    @property
    def worker_id(self) -> str:
        return self.start.worker_id

    @property
    def pid(self) -> int:
        return self.child.proc.pid if self.child.proc is not None else 0

    @property
    def exited(self) -> bool:
        return self.child.exited

    def stop(self, reason: str, grace_s: float) -> None:
        """SIGTERM now, SIGKILL at `grace_s` from now (kill_if_overdue)."""
        if self.stop_reason is None:
            self.stop_reason = reason or "asked to stop"
            self.kill_at = time.monotonic() + grace_s
            self.child.signal(signal.SIGTERM)

    def kill_if_overdue(self, now: float) -> None:
        if self.kill_at is not None and now >= self.kill_at and not self.exited:
            self.child.signal(signal.SIGKILL)
            self.kill_at = None

    def report(self, rss_bytes: int) -> HostWorker:
        s = self.start
        return HostWorker(s.worker_id, s.model, self.pid, s.estimate_bytes, rss_bytes)

    def exit_message(self, host_id: str) -> WorkerExited:
        """The WorkerExited for this ended process: asked, or its exit code and last lines."""
        s, asked = self.start, self.stop_reason is not None
        code = self.child.exit_code
        if code is not None and code < 0:
            status = f"exit code {code} ({signal.Signals(-code).name})"
        else:
            status = f"exit code {code}"
        reason = f"{self.stop_reason}; {status}" if asked else f"{status}: {self.log_tail()}"
        return WorkerExited(host_id, s.worker_id, s.model, asked, reason)

    def log_tail(self) -> str:
        """The last non-empty lines this run wrote to its log."""
        if self.child.log_dir is None:
            return "(no log)"
        try:
            with open(self.child.log_dir / f"{self.worker_id}.log", "rb") as f:
                f.seek(self.log_offset)
                text = f.read()[-64 * 1024 :].decode("utf-8", "replace")
        except OSError as exc:
            return f"(no log: {exc.strerror})"
        lines = [line.rstrip() for line in text.splitlines() if line.strip()]
        return "\n".join(lines[-LOG_TAIL_LINES:])[-LOG_TAIL_CHARS:] or "(empty log)"
