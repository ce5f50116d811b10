"""The asking side of the KV channel: one request and its reply over a DEALER socket, link
probes, and the table of measured link rates the heartbeat reports."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

import zmq

from shared.kv_transfer import Probe, ProbeReply, decode, encode, with_block_frames
from shared.protocol import LinkRate

PROBE_BYTES = 4 * 1024 * 1024
PROBE_TIMEOUT_S = 5.0
EWMA = 0.3  # weight of a new measurement


class PeerUnreachable(Exception):
    """No reply in time (the peer is dead, busy or unreachable)."""


def ask(
    ctx: zmq.Context,
    endpoint: str,
    msg,
    timeout_s: float,
    configure: Callable[[zmq.Socket], object] | None = None,
):
    """Send `msg` to the peer at `endpoint` and return its decoded reply; PeerUnreachable
    after `timeout_s` in all, ProtocolError on a reply that is not a message."""
    sock = ctx.socket(zmq.DEALER)
    try:
        sock.setsockopt(zmq.LINGER, 0)
        if configure is not None:
            configure(sock)
        sock.connect(endpoint)
        sock.send(encode(msg))
        if not sock.poll(int(timeout_s * 1000), zmq.POLLIN):
            raise PeerUnreachable(f"no reply from {endpoint} in {timeout_s:.1f}s")
        head, *blocks = sock.recv_multipart(copy=False)
        return with_block_frames(decode(head.buffer), [frame.buffer for frame in blocks])
    finally:
        sock.close(linger=0)


def probe_link(
    ctx: zmq.Context, endpoint: str, configure: Callable[[zmq.Socket], object] | None = None
) -> tuple[float, float]:
    """(bytes_per_s, latency_s) to the peer: the best of three small round trips, then one
    PROBE_BYTES reply."""
    latency = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        _expect_probe(ask(ctx, endpoint, Probe(uuid.uuid4().hex), PROBE_TIMEOUT_S, configure))
        latency = min(latency, time.perf_counter() - start)
    start = time.perf_counter()
    reply = ask(ctx, endpoint, Probe(uuid.uuid4().hex, PROBE_BYTES), PROBE_TIMEOUT_S, configure)
    seconds = time.perf_counter() - start
    _expect_probe(reply)
    return len(reply.payload) / max(seconds - latency, 1e-6), latency


def _expect_probe(reply) -> None:
    if not isinstance(reply, ProbeReply):
        raise PeerUnreachable(f"the peer answered a probe with {type(reply).__name__}")


class LinkTable:
    """Measured link rates to peers (EWMA over probes and real transfers); thread-safe."""

    def __init__(self):
        self._rates: dict[str, LinkRate] = {}
        self._lock = threading.Lock()

    def observe(self, peer_id: str, bytes_per_s: float, latency_s: float | None = None) -> None:
        with self._lock:
            old = self._rates.get(peer_id)
            if old is not None:
                bytes_per_s = EWMA * bytes_per_s + (1 - EWMA) * old.bytes_per_s
                latency_s = old.latency_s if latency_s is None else latency_s
            self._rates[peer_id] = LinkRate(peer_id, bytes_per_s, latency_s or 0.0)

    def forget_others(self, peer_ids: set[str]) -> None:
        with self._lock:
            self._rates = {p: r for p, r in self._rates.items() if p in peer_ids}

    def snapshot(self) -> tuple[LinkRate, ...]:
        with self._lock:
            return tuple(self._rates.values())
