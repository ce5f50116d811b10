"""A real redis-server (Debian's `redis-server`; scripts/setup installs it) for the tests of
the routers' shared state: started on a free port with a temp folder, nothing persisted, and
stopped by the caller. No in-process fake: the Lua scripts run as they will in production."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

BINARY = shutil.which("redis-server")
MISSING = "redis-server is not installed (scripts/setup installs Debian's redis-server)"


@dataclass
class RedisServer:
    process: subprocess.Popen
    port: int

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def flush(self) -> None:
        """Forget every key: each test starts from an empty server."""
        _command(self.port, b"*1\r\n$8\r\nFLUSHALL\r\n")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_redis(folder: Path, timeout_s: float = 10.0) -> RedisServer:
    """A redis-server on a free 127.0.0.1 port, its files in `folder`, ready for commands."""
    if BINARY is None:
        raise RuntimeError(MISSING)
    port = _free_port()
    args = [BINARY, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder)]
    args += ["--save", "", "--appendonly", "no", "--protected-mode", "yes"]
    log = open(folder / "redis.log", "wb")  # noqa: SIM115 - the server's, closed with it
    server = RedisServer(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT), port)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"redis-server exited: {(folder / 'redis.log').read_text()}")
        try:
            if _command(port, b"*1\r\n$4\r\nPING\r\n").startswith(b"+PONG"):
                return server
        except OSError:
            time.sleep(0.05)
    server.stop()
    raise RuntimeError(f"redis-server did not answer on port {port} in {timeout_s} s")


def _command(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
        conn.sendall(request)
        return conn.recv(64)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
