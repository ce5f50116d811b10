"""Start, watch, restart and stop the processes of a local cluster."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from shared.parent_watch import ENV as PARENT_ENV
from shared.parent_watch import SPAWNED_AT_ENV

BACKOFF_START_S = 0.0  # the first restart is immediate; repeated crashes back off
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
HEALTHY_RUN_S = 60.0  # a child that ran this long starts its backoff afresh
STOP_GRACE_S = 10.0


NO_PDEATHSIG_ENV = "MLX_FLEET_NO_PDEATHSIG"  # tests: leave it to the children's parent watch


def _die_with_parent() -> None:
    """Linux: have the kernel SIGTERM this child if the launcher dies (even by SIGKILL).
    Children also watch their parent themselves (shared/parent_watch.py, the macOS way)."""
    if sys.platform.startswith("linux") and not os.environ.get(NO_PDEATHSIG_ENV):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def child_env(threads: int) -> dict:
    """The environment of a child of this process: `threads` BLAS threads, the BLAS
    preloaded, unbuffered output, and this pid to watch (shared/parent_watch.py)."""
    from shared.blas import preload_env

    env = preload_env()  # children start with the BLAS preloaded: no re-exec needed
    env["_MLX_FLEET_REEXECED"] = "1"
    env[PARENT_ENV] = str(os.getpid())  # children watch it (shared/parent_watch.py)
    for var in (
        "OPENBLAS_NUM_THREADS",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "VECLIB_MAXIMUM_THREADS",
    ):
        env[var] = str(threads)
    env.setdefault("PYTHONUNBUFFERED", "1")
    # transformers warns at import that PyTorch is missing: router and workers need no PyTorch
    env.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    return env


def cluster_state(url: str) -> dict | None:
    """A router's /v1/cluster, or None while it does not answer."""
    try:
        with urllib.request.urlopen(f"{url}/v1/cluster", timeout=2) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


def say(msg: str) -> None:
    print(f"[launch-cluster] {msg}", file=sys.stderr, flush=True)


@dataclass
class Child:
    name: str
    cmd: list[str]
    env: dict
    restart: bool
    log_dir: Path | None = None
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    backoff: float = BACKOFF_START_S
    restart_at: float | None = None
    restarts: int = field(default=0)

    def start(self) -> None:
        out = None
        if self.log_dir:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            out = open(self.log_dir / f"{self.name}.log", "ab")  # noqa: SIM115 - the child owns it
        env = {**self.env, SPAWNED_AT_ENV: f"{time.time():.3f}"}
        self.proc = subprocess.Popen(
            self.cmd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT if out else None,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        if out:
            out.close()
        self.started_at = time.monotonic()
        self.restart_at = None

    @property
    def exited(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    @property
    def exit_code(self) -> int | None:
        return self.proc.returncode if self.proc is not None else None

    def processes(self) -> list[subprocess.Popen]:
        return [self.proc] if self.proc is not None else []

    def stop_rest(self) -> None:
        """Nothing else to stop: one process."""


@dataclass
class RankGroup:
    """The `size` rank processes of one tensor-parallel worker: they start, stop and restart
    as one (a group missing a rank cannot serve). Each start writes a fresh ring hostfile on
    new loopback ports (the old ones may linger) and gives rank r MLX_RANK=r."""

    name: str
    cmd: list[str]
    env: dict
    size: int
    restart: bool = True
    log_dir: Path | None = None
    ranks: list[Child] = field(default_factory=list)
    started_at: float = 0.0
    backoff: float = BACKOFF_START_S
    restart_at: float | None = None
    restarts: int = 0
    hostfile: Path | None = None

    def start(self) -> None:
        if self.hostfile is not None:
            self.hostfile.unlink(missing_ok=True)
        self.hostfile = hostfile = ring_hostfile(self.size)
        self.ranks = [
            Child(
                f"{self.name}-rank{r}",
                self.cmd,
                {**self.env, "MLX_RANK": str(r), "MLX_HOSTFILE": str(hostfile)},
                restart=False,
                log_dir=self.log_dir,
            )
            for r in range(self.size)
        ]
        for rank in self.ranks:
            rank.start()
        self.started_at = time.monotonic()
        self.restart_at = None

    @property
    def exited(self) -> bool:
        return any(r.exited for r in self.ranks)

    @property
    def exit_code(self) -> int | None:
        return next((r.exit_code for r in self.ranks if r.exited), None)

    def signal(self, sig: int) -> None:
        for r in self.ranks:
            r.signal(sig)

    def processes(self) -> list[subprocess.Popen]:
        return [p for r in self.ranks for p in r.processes()]

    def stop_rest(self) -> None:
        """One rank exited: kill the others now (their watchdog would, later)."""
        for r in self.ranks:
            if not r.exited:
                say(f"stopping {r.name} with its group")
                r.proc.kill()
                r.proc.wait()


def ring_hostfile(size: int) -> Path:
    """An MLX ring hostfile of `size` ranks on free loopback ports."""
    socks = [socket.socket() for _ in range(size)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ring = [[f"127.0.0.1:{s.getsockname()[1]}"] for s in socks]
    for s in socks:
        s.close()
    fd, path = tempfile.mkstemp(prefix="mlx-fleet-ring-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(ring, f)
    return Path(path)


class Supervisor:
    def __init__(self, router: Child | list[Child], workers: list[Child | RankGroup]):
        """`router`: the router, or several (each serving every worker)."""
        self.routers = router if isinstance(router, list) else [router]
        self.router, self.workers = self.routers[0], workers
        self.stopping = False

    def start(self) -> None:
        for child in [*self.routers, *self.workers]:
            child.start()

    def request_stop(self) -> None:
        self.stopping = True

    def router_dead(self) -> bool:
        """A router exited for good: before it ever answered (a bad config, a busy port)."""
        for router in self.routers:
            if router.exited and not router.restart and not self.stopping:
                say(f"{router.name} exited with code {router.exit_code}")
                return True
        return False

    def poll(self) -> None:
        """Restart children that died (the router too, once serving), each after its backoff.
        Workers re-register with a restarted router on their own (ReRegister)."""
        now = time.monotonic()
        for w in [*self.routers, *self.workers]:
            if self.stopping:
                return
            if w.restart_at is not None and now >= w.restart_at:
                w.restarts += 1
                say(f"restarting {w.name} (restart #{w.restarts})")
                w.start()
            elif w.exited and w.restart_at is None and w.restart:
                if now - w.started_at >= HEALTHY_RUN_S:
                    w.backoff = BACKOFF_START_S
                say(f"{w.name} exited with code {w.exit_code}; restarting in {w.backoff:.0f}s")
                w.stop_rest()
                w.restart_at = now + w.backoff
                w.backoff = min(BACKOFF_MAX_S, max(BACKOFF_FIRST_S, w.backoff * 2))

    def supervise(self) -> int:
        """Until told to stop: restart whatever dies, the routers included."""
        for router in self.routers:
            router.restart = True
        while not self.stopping:
            self.poll()
            time.sleep(0.2)
        return 0

    def shutdown(self) -> None:
        """Routers first (they end open streams), then the workers; SIGKILL what lingers."""
        self.stopping = True
        say("shutting down")
        for group in (self.routers, self.workers):
            for c in group:
                c.signal(signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            for proc in (p for c in group for p in c.processes()):
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    say(f"pid {proc.pid} did not stop in {STOP_GRACE_S:.0f}s; killing it")
                    proc.kill()
                    proc.wait()
