"""Test ROUTER sockets playing the router: `Router` for several workers (registers them, keeps
their last heartbeats and the deltas of each request; peer transfer tests), `FakeRouter` for one
worker's loop, message by message (worker loop tests)."""

from __future__ import annotations

import time

import zmq

from shared.protocol import Generate, Heartbeat, Register, RegisterAck, TokenDelta, decode, encode


class Router:
    """The router's ROUTER socket, as far as these workers need it."""

    def __init__(self):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.endpoint = f"tcp://127.0.0.1:{self.sock.bind_to_random_port('tcp://127.0.0.1')}"
        self.ids: dict[str, bytes] = {}
        self.registers: dict[str, Register] = {}
        self.beats: dict[str, Heartbeat] = {}
        self.deltas: dict[str, list[TokenDelta]] = {}
        self.on_other = lambda msg: None  # KV events and the rest

    def pump(self, until, timeout: float = 120.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (found := until()) is not None:
                return found
            if not self.sock.poll(100):
                continue
            identity, frame = self.sock.recv_multipart()
            msg = decode(frame)
            if isinstance(msg, Register):
                self.ids[msg.worker_id], self.registers[msg.worker_id] = identity, msg
                self.sock.send_multipart(
                    [identity, encode(RegisterAck(True, heartbeat_interval_s=0.2))]
                )
            elif isinstance(msg, Heartbeat):
                self.beats[msg.worker_id] = msg
            elif isinstance(msg, TokenDelta):
                self.deltas.setdefault(msg.request_id, []).append(msg)
            else:
                self.on_other(msg)
        raise TimeoutError("the workers did not get there")

    def send(self, worker_id: str, msg) -> None:
        self.sock.send_multipart([self.ids[worker_id], encode(msg)])

    def run(self, worker_id: str, msg: Generate, timeout: float = 120.0) -> list[int]:
        self.send(worker_id, msg)
        done = self.pump(lambda: self._finished(msg.request_id), timeout)
        assert done[-1].finish_reason in ("length", "stop"), done[-1]
        return [t for d in done for t in d.token_ids]

    def _finished(self, request_id: str):
        deltas = self.deltas.get(request_id, [])
        return deltas if deltas and deltas[-1].finish_reason else None

    def idle_beat(self, worker_id: str) -> Heartbeat:
        """A heartbeat sent after the worker went idle (fresh: its loop turned since)."""
        start = time.monotonic()
        self.pump(lambda: None if time.monotonic() - start < 0.6 else True)
        return self.beats[worker_id]


class FakeRouter:
    def __init__(self):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.identity: bytes | None = None

    def recv(self, timeout: float = 10.0):
        if not self.sock.poll(int(timeout * 1000)):
            raise TimeoutError("nothing from the worker")
        identity, frame = self.sock.recv_multipart()
        self.identity = identity
        return decode(frame)

    def recv_until(self, kind, timeout: float = 10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = self.recv(deadline - time.monotonic())
            if isinstance(msg, kind):
                return msg
        raise TimeoutError(f"no {kind.__name__}")

    def send(self, msg) -> None:
        self.sock.send_multipart([self.identity, encode(msg)])

    def send_raw(self, frame: bytes) -> None:
        self.sock.send_multipart([self.identity, frame])

    def close(self):
        self.sock.close(linger=0)
        self.ctx.term()
