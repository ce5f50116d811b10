"""The worker's side of the wire: a thread that owns the DEALER socket.

ZeroMQ sockets belong to one thread, and the engine thread spends most of its time inside
MLX (which releases the GIL), so a separate I/O thread can register, heartbeat and pass
messages at any moment, a long prefill step included. The engine thread hands frames to it
through an inproc PUSH/PULL pair and reads what arrives from a queue, as (this link, message).

Sends to the router never block: with the router gone (restarting, or one of several that
died), frames queue up to ZeroMQ's high-water mark and the rest are dropped (counted), so
neither this thread nor the engine thread behind it stalls. Nothing is lost that matters: a
router that comes back asks the worker to register again and gets its inventory, and one that
sees a KV event number skipped asks for the inventory (SendInventory).
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable

import zmq

from shared.protocol import (
    KVEvents,
    KVInventory,
    Message,
    ProtocolError,
    Register,
    RegisterAck,
    ReRegister,
    decode,
    encode,
)

log = logging.getLogger(__name__)

REGISTER_RETRY_S = 2.0  # resend Register until the router answers (it may start later)


class RegistrationRefused(RuntimeError):
    """The router answered Register with accepted=False."""


class RouterConnection:
    """This worker's connection to the router: registration, heartbeats and messages both
    ways, on a thread of its own (named apart from the router's own `WorkerLink`)."""

    def __init__(
        self,
        endpoint: str,
        register: Register,
        heartbeat: Callable[[], Message],
        configure_socket: Callable[[zmq.Socket], object] | None = None,
        inbound: queue.Queue[tuple[RouterConnection, Message] | None] | None = None,
    ):
        """`inbound`: where what the router sends goes, as (this link, message) (a queue
        shared by several links; default: one of its own)."""
        self.endpoint, self.register, self.heartbeat = endpoint, register, heartbeat
        self.configure_socket = configure_socket
        self.inbound = queue.Queue() if inbound is None else inbound
        self.dropped = 0  # frames not sent: the router was unreachable and the queue full
        self.registered = threading.Event()
        self.refused: str | None = None
        self._ctx = zmq.Context()
        self._out_addr = f"inproc://worker-out-{id(self)}"
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.bind(self._out_addr)
        self._push_local = threading.local()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="worker-link", daemon=True)
        self._heartbeat_interval = 1.0
        self._next_register = 0.0
        self._kv_seq = 0  # the number of the last KVEvents queued on this link
        self._kv_lock = threading.Lock()  # numbering and queueing in one order

    # ---- engine-thread side ------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def send(self, msg: Message) -> None:
        """Queue `msg` for the router (callable from any thread but the link's own). KVEvents
        are numbered on this link (`KVEvents.seq`) and an inventory says after which one it
        was taken, so that the router sees a frame lost on the way and asks again."""
        push = getattr(self._push_local, "socket", None)
        if push is None:
            push = self._push_local.socket = self._ctx.socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, 0)
            push.connect(self._out_addr)
        if not isinstance(msg, KVEvents | KVInventory):
            push.send(encode(msg))
            return
        with self._kv_lock:
            if isinstance(msg, KVEvents):
                self._kv_seq += 1
                msg = dataclasses.replace(msg, seq=self._kv_seq)
            else:
                msg = dataclasses.replace(msg, last_seq=self._kv_seq)
            push.send(encode(msg))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        push = getattr(self._push_local, "socket", None)
        if push is not None:
            push.close(linger=0)
        self._ctx.destroy(linger=0)

    # ---- the link thread ---------------------------------------------------------------

    def _run(self) -> None:
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        keep_alive = self.configure_socket(dealer) if self.configure_socket else None  # noqa: F841
        dealer.connect(self.endpoint)
        poller = zmq.Poller()
        poller.register(dealer, zmq.POLLIN)
        poller.register(self._pull, zmq.POLLIN)
        next_heartbeat = 0.0
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if not self.registered.is_set() and now >= self._next_register:
                    self._send(dealer, encode(self.register))
                    self._next_register = now + REGISTER_RETRY_S
                if self.registered.is_set() and now >= next_heartbeat:
                    self._send(dealer, encode(self.heartbeat()))
                    next_heartbeat = now + self._heartbeat_interval
                for sock, _ in poller.poll(timeout=50):
                    if sock is dealer:
                        self._receive(dealer.recv())
                    else:
                        self._send(dealer, self._pull.recv())
        finally:
            dealer.close(linger=0)
            self._pull.close(linger=0)

    def _send(self, dealer: zmq.Socket, frame: bytes) -> None:
        try:
            dealer.send(frame, zmq.NOBLOCK)
        except zmq.Again:
            if not self.dropped:
                log.warning("the router at %s is unreachable: dropping frames", self.endpoint)
            self.dropped += 1

    def _receive(self, frame: bytes) -> None:
        try:
            msg = decode(frame)
        except ProtocolError as exc:
            log.warning("dropped a malformed frame from the router: %s", exc)
            return
        if isinstance(msg, RegisterAck):
            self._on_ack(msg)
        elif isinstance(msg, ReRegister):
            log.warning("the router asked this worker to register again: %s", msg.reason)
            self.registered.clear()
            self._next_register = 0.0
        else:
            self.inbound.put((self, msg))

    def _on_ack(self, ack: RegisterAck) -> None:
        if not ack.accepted:
            self.refused = ack.reason or "no reason given"
            log.error("the router refused this worker: %s", self.refused)
            self._stop.set()
            self.inbound.put((self, ack))  # wakes the engine thread so it can exit
            return
        self._heartbeat_interval = max(0.05, ack.heartbeat_interval_s)
        if not self.registered.is_set():
            log.info("registered with the router at %s", self.endpoint)
        self.registered.set()
        # the engine thread answers with the inventory; the peers are to fetch KV blocks from
        self.inbound.put((self, ack))
