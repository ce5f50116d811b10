"""A router as the host agent sees it: a real ZeroMQ ROUTER socket in the test, and the real
agent (`python -m fleet.host`) as a subprocess connected to it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

from shared.placement.messages import HostAck, HostHello
from shared.protocol import decode, encode
from tests.support.paths import ROOT


class FakeRouter:
    """The ROUTER end: frames from the agent and from the workers it starts."""

    def __init__(self):
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        port = self.socket.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.agent: bytes | None = None  # the agent's identity, from its HostHello
        self.seen: list = []

    def expect(self, kind: type, timeout: float = 10.0, where=lambda m: True):
        """The next message of `kind` for which `where` holds (others are kept in `seen`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.socket.poll(100):
                continue
            identity, frame = self.socket.recv_multipart()
            msg = decode(frame)
            self.seen.append(msg)
            if isinstance(msg, HostHello):
                self.agent = identity
            if isinstance(msg, kind) and where(msg):
                return msg
        raise AssertionError(f"no {kind.__name__} in {timeout}s; seen {self.seen[-5:]}")

    def send(self, msg) -> None:
        assert self.agent is not None, "no HostHello yet"
        self.socket.send_multipart([self.agent, encode(msg)])

    def accept(self, report_interval_s: float = 0.2) -> HostHello:
        hello = self.expect(HostHello)
        self.send(HostAck(True, report_interval_s=report_interval_s))
        return hello

    def close(self) -> None:
        self.socket.close(linger=0)
        self.context.term()


@pytest.fixture
def fake_router():
    router = FakeRouter()
    yield router
    router.close()


def write_config(path: Path, models: dict[str, str | None]) -> Path:
    """A fleet config whose [[models]] are `models` (id -> path; None: the default model)."""
    lines = []
    for model_id, model_path in models.items():
        lines += ["[[models]]", f'id = "{model_id}"']
        lines += [f'path = "{model_path}"'] if model_path else []
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def start_agent(tmp_path):
    """Start `python -m fleet.host` with the given flags; stopped (SIGKILL) at teardown."""
    agents: list[subprocess.Popen] = []

    def start(config: Path, router: str, *flags: str, env: dict | None = None) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "fleet.host", "--config", str(config), "--router", router]
        cmd += ["--host-id", "host-t", "--log-dir", str(tmp_path / "logs"), *flags]
        env = {
            **os.environ,
            "MLX_FLEET_CACHE": os.environ.get("MLX_FLEET_CACHE", ""),
            **(env or {}),
        }
        env = {k: v for k, v in env.items() if v}
        agent = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
        agents.append(agent)
        return agent

    yield start
    for agent in agents:
        if agent.poll() is None:
            agent.send_signal(signal.SIGTERM)
            try:
                agent.wait(timeout=20)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()
