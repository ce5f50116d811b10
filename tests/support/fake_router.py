"""A ROUTER socket playing the router, for tests of the worker's loop."""

from __future__ import annotations

import time

import zmq

from shared.protocol import decode, encode


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
