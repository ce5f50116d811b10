"""Servers the comparison runner starts: each in its own process group, logged to a file,
polled until healthy, and stopped (SIGTERM to the group, SIGKILL after a grace period)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[2]
STOP_GRACE_S = 15.0
LOG_TAIL_CHARS = 2000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    argv: list[str]
    port: int
    model: str | None = None  # the model name clients send; None: the first of /v1/models
    expected_workers: int | None = None  # /health must report this many healthy workers
    env: dict[str, str] = field(default_factory=dict)  # added to os.environ

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class ServiceFailed(RuntimeError):
    """The service exited or never became healthy; the message ends with its log's tail."""


class Service:
    """A started server process (and everything it starts, through its process group)."""

    def __init__(self, spec: ServiceSpec, log_path: Path):
        self.spec = spec
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "wb") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                spec.argv,
                cwd=ROOT,
                env={**os.environ, **spec.env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: Ctrl-C here is ours to handle
            )

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
        return ""

    async def wait_healthy(self, timeout_s: float) -> float:
        """Poll /health until it is ready; returns the seconds it took."""
        start = time.monotonic()
        async with aiohttp.ClientSession() as session:
            while time.monotonic() - start < timeout_s:
                if self.proc.poll() is not None:
                    raise self._failed(f"exited with status {self.proc.returncode}")
                if await self._healthy(session):
                    return time.monotonic() - start
                await asyncio.sleep(0.5)
        raise self._failed(f"not healthy after {timeout_s:g}s")

    async def _healthy(self, session: aiohttp.ClientSession) -> bool:
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            timeout = aiohttp.ClientTimeout(total=5)
            async with session.get(f"{self.spec.url}/health", timeout=timeout) as resp:
                if resp.status != 200:
                    return False
                body = await resp.json(content_type=None)
                want = self.spec.expected_workers
                if want is None or not isinstance(body, dict) or "healthy_workers" not in body:
                    return True
                return body["healthy_workers"] >= want
        return False

    def _failed(self, why: str) -> ServiceFailed:
        return ServiceFailed(
            f"{self.spec.name} {why}; {self.log_path} ends with:\n{self.log_tail()}"
        )

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM the process group, wait for all of it, SIGKILL what is left. Idempotent."""
        pgid = self.proc.pid  # start_new_session: the group id is the leader's pid
        self._signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=grace_s)
        while self._group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if self._group_alive(pgid):
            self._signal_group(pgid, signal.SIGKILL)
        self.proc.wait()

    @staticmethod
    def _signal_group(pgid: int, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)

    @staticmethod
    def _group_alive(pgid: int) -> bool:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
