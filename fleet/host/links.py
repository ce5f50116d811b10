"""One DEALER socket per router, as a worker connects (worker/connection.py): CURVE when the
[worker] keys are set, HostHello re-sent until the router acknowledges it."""

from __future__ import annotations

import logging
from collections.abc import Callable

import zmq

from shared.protocol import ProtocolError, decode, encode

log = logging.getLogger("fleet.host")

HELLO_RETRY_S = 2.0  # a router not up yet (or restarted) gets HostHello again this often
HELLO_MIN_GAP_S = 0.5  # ReRegister answered no faster (a router that knows no host agents)


class RouterLink:
    """The agent's socket to one router, and what that router told it."""

    def __init__(
        self,
        context: zmq.Context,
        endpoint: str,
        configure: Callable[[zmq.Socket], object] | None = None,
    ):
        self.endpoint = endpoint
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        if configure is not None:
            configure(self.socket)
        self.socket.connect(endpoint)
        self.acked = False
        self.next_hello = 0.0  # monotonic time of the next HostHello, until acked
        self.last_hello = -HELLO_MIN_GAP_S
        self.report_interval_s = 1.0
        self.next_report = 0.0

    def send(self, msg) -> bool:
        """Queue `msg` for the router; False when its queue is full (the router is away)."""
        try:
            self.socket.send(encode(msg), zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False

    def receive(self):
        """The next message from the router (the socket is readable), or None if malformed."""
        frame = self.socket.recv()
        try:
            return decode(frame)
        except ProtocolError as exc:
            log.warning("dropped a malformed frame from %s: %s", self.endpoint, exc)
            return None

    def hello_sent(self, now: float) -> None:
        self.last_hello, self.next_hello = now, now + HELLO_RETRY_S

    def acknowledged(self, report_interval_s: float, now: float) -> None:
        self.acked = True
        self.report_interval_s = max(0.05, report_interval_s)
        self.next_report = now

    def forget(self) -> None:
        """The router asked for HostHello again (it restarted): send it soon."""
        self.acked = False
        self.next_hello = self.last_hello + HELLO_MIN_GAP_S

    def close(self) -> None:
        self.socket.close(linger=0)


def curve_setup(worker_section) -> Callable[[zmq.Socket], object] | None:
    """The [worker] CURVE keys applied to a socket before it connects, when set."""
    if not worker_section.curve_enabled:
        return None
    from shared.curve import configure_client

    secret, server = worker_section.curve_secret_key, worker_section.curve_server_key
    return lambda sock: configure_client(sock, secret, server)
