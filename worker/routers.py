"""A worker's links to every router it serves: one RouterConnection each, one inbound queue.

Each router gets the worker's Register, heartbeats, KV events and, once it accepts, the
worker's inventory, so each keeps a full prefix index of its own. A request is answered on the
link it came in on (worker/live.py keeps which); a delta of a request no longer held goes to
every router, and those that do not know it drop it."""

from __future__ import annotations

import queue
from collections.abc import Callable, Sequence

import zmq

from shared.protocol import Message, Peer, Register
from worker.connection import RouterConnection

Arrival = tuple[RouterConnection, Message] | None  # None: a wake-up


class RouterLinks:
    def __init__(
        self,
        endpoints: Sequence[str],
        register: Register,
        heartbeat: Callable[[], Message],
        configure_socket: Callable[[zmq.Socket], object] | None = None,
    ):
        if not endpoints:
            raise ValueError("a worker needs at least one router")
        self.inbound: queue.Queue[Arrival] = queue.Queue()
        self.links = [
            RouterConnection(endpoint, register, heartbeat, configure_socket, self.inbound)
            for endpoint in endpoints
        ]
        self._peers: dict[RouterConnection, tuple[Peer, ...]] = {}

    @property
    def refused(self) -> str | None:
        """Why a router refused this worker (the worker then stops), or None."""
        return next((link.refused for link in self.links if link.refused), None)

    def start(self) -> None:
        for link in self.links:
            link.start()

    def stop(self) -> None:
        for link in self.links:
            link.stop()

    def wake(self) -> None:
        self.inbound.put(None)

    def arrivals(self, wait: float = 0.0) -> list[tuple[RouterConnection, Message]]:
        """Every message that has arrived, from any router, in order; with `wait` > 0, up to
        that long for the first one (a `wake` ends the wait early)."""
        got: list[tuple[RouterConnection, Message]] = []
        try:
            arrival = self.inbound.get(timeout=wait) if wait > 0 else self.inbound.get_nowait()
            while True:
                if arrival is not None:  # None: a wake-up
                    got.append(arrival)
                arrival = self.inbound.get_nowait()
        except queue.Empty:
            return got

    def broadcast(self, msg: Message) -> None:
        """`msg` to every router (KV events)."""
        for link in self.links:
            link.send(msg)

    def send(self, link: RouterConnection | None, msg: Message) -> None:
        """`msg` on `link` (the one its request came in on), or to every router (None)."""
        if link is None:
            self.broadcast(msg)
        else:
            link.send(msg)

    def peers(self, link: RouterConnection, peers: tuple[Peer, ...]) -> tuple[Peer, ...]:
        """The workers to fetch KV blocks from: the latest list of every router, merged."""
        self._peers[link] = peers
        merged = {p.worker_id: p for listed in self._peers.values() for p in listed}
        return tuple(merged.values())

    @property
    def dropped(self) -> int:
        return sum(link.dropped for link in self.links)
