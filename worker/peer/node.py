"""A worker's part in peer transfer, as its loop sees it: the KV endpoint it serves, the
requests parked while their prefix is fetched, and the link rates to its peers.

Threads: the server thread (worker/peer/server.py), one fetch thread per parked request and a
probe thread per new peer set; the pool is only touched on the engine thread, in `turn()`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import zmq

from shared.config.sections import WorkerSection, default_of
from shared.kv_transfer import FetchBlocks, FetchReply, ProtocolError
from shared.protocol import Generate, Peer
from worker.peer.blocks import PeerBlocks, PullRejected
from worker.peer.channel import PeerChannel, advertised
from worker.peer.fetch import LinkTable, PeerUnreachable, ask, probe_link
from worker.peer.server import PeerServer

if TYPE_CHECKING:
    from worker.engine.engine import Engine

log = logging.getLogger(__name__)

# a whole fetch, the holder's wait for its engine thread included (`--kv-peer-timeout`)
PULL_TIMEOUT_S: float = default_of(WorkerSection, "kv_peer_timeout_s")


class PeerNode:
    def __init__(
        self,
        engine: Engine,
        channel: PeerChannel,
        wake: Callable[[], None],
        pull_timeout_s: float = PULL_TIMEOUT_S,
    ):
        self.channel, self.wake, self.pull_timeout_s = channel, wake, pull_timeout_s
        self.blocks = PeerBlocks(engine)
        self.links = LinkTable()
        self.pulled_blocks = self.pull_failures = 0
        self._ctx = zmq.Context()
        self.server = PeerServer(self._ctx, channel.bind, wake, channel.configure_server)
        self.endpoint = advertised(self.server.endpoint)
        self._parked: dict[str, tuple[Generate, FetchBlocks]] = {}
        self._done: queue.Queue[tuple[Generate, FetchReply | Exception, float]] = queue.Queue()
        self._peers: dict[str, str] = {}

    def start(self) -> None:
        self.server.start()
        log.info("KV endpoint at %s", self.endpoint)

    def stop(self) -> None:
        self.server.stop()
        # a fetch or probe thread closes its socket within its timeout; don't wait for it
        threading.Thread(target=self._ctx.term, name="kv-peer-term", daemon=True).start()

    # ---- engine thread ----------------------------------------------------------------

    def park(self, msg: Generate) -> bool:
        """Start fetching `msg`'s prefix from its pull hint's peer; False when nothing is to
        fetch (admit it now)."""
        hint = msg.pull
        if hint is None or not hint.kv_endpoint or msg.request_id in self._parked:
            return False
        req = self.blocks.wanted(msg.request_id, msg.token_ids, hint.num_blocks)
        if req is None:
            return False
        self._parked[msg.request_id] = (msg, req)
        threading.Thread(
            target=self._fetch, args=(msg, req), name="kv-peer-fetch", daemon=True
        ).start()
        return True

    def abort(self, request_id: str) -> bool:
        """Drop a parked request (its fetch's reply is then ignored); whether it was."""
        return self._parked.pop(request_id, None) is not None

    @property
    def parked(self) -> int:
        return len(self._parked)

    def turn(self) -> list[Generate]:
        """Between engine steps: serve peers' fetches, import finished pulls; the parked
        requests ready to admit (with their blocks cached, or to compute)."""
        self.server.serve_pending(self.blocks.serve)
        ready = []
        while True:
            try:
                msg, reply, seconds = self._done.get_nowait()
            except queue.Empty:
                return ready
            parked = self._parked.get(msg.request_id)
            if parked is None or parked[0] is not msg:
                continue  # aborted meanwhile
            del self._parked[msg.request_id]
            self._import(msg, parked[1], reply, seconds)
            ready.append(msg)

    def _import(self, msg: Generate, req: FetchBlocks, reply, seconds: float) -> None:
        try:
            if isinstance(reply, Exception):
                raise reply
            if not isinstance(reply, FetchReply):
                raise PullRejected(f"the peer answered with {type(reply).__name__}")
            self.pulled_blocks += self.blocks.load(req, reply)
            self.links.observe(msg.pull.worker_id, sum(map(len, reply.blocks)) / seconds)
        except (PullRejected, PeerUnreachable, ProtocolError, zmq.ZMQError) as exc:
            self.pull_failures += 1
            log.warning(
                "pull of %s from %s failed, computing it: %s",
                msg.request_id,
                msg.pull.worker_id,
                exc,
            )
        except Exception:  # a bug: still compute the request
            self.pull_failures += 1
            log.exception("importing the blocks of %s failed, computing it", msg.request_id)

    def set_peers(self, peers: tuple[Peer, ...]) -> None:
        """The router's current peer list: probe the links to new ones in the background."""
        new = [p for p in peers if p.kv_endpoint and self._peers.get(p.worker_id) != p.kv_endpoint]
        self._peers = {p.worker_id: p.kv_endpoint for p in peers if p.kv_endpoint}
        self.links.forget_others(set(self._peers))
        if new:
            threading.Thread(
                target=self._probe, args=(new,), name="kv-peer-probe", daemon=True
            ).start()

    # ---- other threads ----------------------------------------------------------------

    def _fetch(self, msg: Generate, req: FetchBlocks) -> None:
        start = time.perf_counter()
        try:
            reply = ask(
                self._ctx,
                msg.pull.kv_endpoint,
                req,
                self.pull_timeout_s,
                self.channel.configure_client,
            )
        except Exception as exc:  # reported on the engine thread, as a failed pull
            reply = exc if isinstance(exc, PeerUnreachable | ProtocolError) else PullRejected(exc)
        self._done.put((msg, reply, max(time.perf_counter() - start, 1e-6)))
        self.wake()

    def _probe(self, peers: list[Peer]) -> None:
        for peer in peers:
            try:
                rate, latency = probe_link(
                    self._ctx, peer.kv_endpoint, self.channel.configure_client
                )
            except Exception as exc:
                log.warning("probing the link to %s failed: %s", peer.worker_id, exc)
                continue
            self.links.observe(peer.worker_id, rate, latency)
            log.info("link to %s: %.0f MB/s, %.2f ms", peer.worker_id, rate / 1e6, latency * 1e3)
