"""A worker's links to every router it serves: one RouterConnection each, one inbound queue.

Each router gets the worker's Register, heartbeats, KV events and, once it accepts, the
worker's inventory, so each keeps a full prefix index of its own. A request is answered on the
link it came in on (its owner, kept until its last choice finishes or it is aborted); a delta
of a request no link owns goes to every router, and those that do not know it drop it."""

from __future__ import annotations

import queue
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import zmq

from shared.protocol import Generate, Message, Peer, Register, TokenDelta
from worker.connection import RouterConnection

Arrival = tuple[RouterConnection, Message] | None  # None: a wake-up


@dataclass
class _Owner:
    link: RouterConnection
    running: int  # choices whose final delta is still to come


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
        self._owners: dict[str, _Owner] = {}  # request id -> the link it came in on
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

    def broadcast(self, msg: Message) -> None:
        """`msg` to every router (KV events)."""
        for link in self.links:
            link.send(msg)

    def accepted(self, link: RouterConnection, request: Generate) -> None:
        """`request` came from `link`: its deltas go back there."""
        if len(self.links) > 1:
            self._owners[request.request_id] = _Owner(link, request.n)

    def reply(self, delta: TokenDelta) -> None:
        """`delta` to the router that sent its request."""
        if len(self.links) == 1:
            self.links[0].send(delta)
            return
        owner = self._owners.get(delta.request_id)
        if owner is None:
            self.broadcast(delta)
            return
        owner.link.send(delta)
        if delta.finish_reason is not None:
            self.choice_done(delta.request_id)

    def choice_done(self, request_id: str) -> None:
        """One choice of `request_id` ended without a final delta still to send (aborted)."""
        owner = self._owners.get(request_id)
        if owner is not None:
            owner.running -= 1
            if owner.running <= 0:
                del self._owners[request_id]

    def forget(self, request_id: str) -> None:
        """`request_id` was aborted: nothing more of it is sent."""
        self._owners.pop(request_id, None)

    def peers(self, link: RouterConnection, peers: tuple[Peer, ...]) -> tuple[Peer, ...]:
        """The workers to fetch KV blocks from: the latest list of every router, merged."""
        self._peers[link] = peers
        merged = {p.worker_id: p for listed in self._peers.values() for p in listed}
        return tuple(merged.values())

    @property
    def dropped(self) -> int:
        return sum(link.dropped for link in self.links)
