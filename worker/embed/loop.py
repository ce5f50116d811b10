"""The embedding worker's loop: Embed messages from the router in, Embeddings out.

Each turn takes every Embed that has arrived and runs their inputs together (one Embedder
call: sorted by length, batched), then answers each request on the link it came in on. No
KV pool: the worker registers with no blocks, and its heartbeat's load is requests queued."""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from shared.config.choices import DEFAULT_BLOCK_SIZE
from shared.models.embedding import EmbeddingSpec
from shared.protocol import (
    Abort,
    Embed,
    Embeddings,
    Generate,
    Heartbeat,
    Register,
    RegisterAck,
    Shutdown,
    TokenDelta,
    Usage,
)
from worker.connection import RouterConnection
from worker.embed.embedder import Embedder
from worker.embed.pooling import finish
from worker.routers import RouterLinks
from worker.watchdog import LoopWatchdog

log = logging.getLogger(__name__)

IDLE_WAIT_S = 0.05
MAX_TURN_INPUTS = 512  # inputs one turn takes, across requests: a big request goes alone


@dataclass
class _Pending:
    link: RouterConnection
    msg: Embed


class EmbedLoop:
    def __init__(
        self,
        embedder: Embedder,
        endpoint: str | Sequence[str],
        worker_id: str,
        model_id: str,
        configure_socket=None,
        watchdog_s: float = 0.0,
    ):
        self.embedder, self.spec, self.worker_id = embedder, embedder.spec, worker_id
        register = Register(
            worker_id=worker_id,
            model_id=model_id,
            block_size=DEFAULT_BLOCK_SIZE,
            kv_capacity_blocks=0,
            host=socket.gethostname(),
            pid=os.getpid(),
            task="embed",
        )
        self.pending: list[_Pending] = []
        self.turns = self.prompt_tokens = self.served = 0
        self.watchdog = LoopWatchdog(watchdog_s)
        endpoints = (endpoint,) if isinstance(endpoint, str) else tuple(endpoint)
        self.routers = RouterLinks(endpoints, register, self._heartbeat, configure_socket)
        self.stopping = threading.Event()

    def serve_forever(self) -> int:
        self.routers.start()
        self.watchdog.start()
        try:
            while not self.stopping.is_set():
                for link, msg in self.routers.arrivals(wait=0 if self.pending else IDLE_WAIT_S):
                    self._handle(link, msg)
                if self.pending:
                    self._turn()
                self.turns += 1
                self.watchdog.turned()
        finally:
            self.watchdog.stop()
            self.routers.stop()
        return 1 if self.routers.refused else 0

    def stop(self) -> None:
        self.stopping.set()

    def _handle(self, link: RouterConnection, msg) -> None:
        if isinstance(msg, Embed):
            self.pending.append(_Pending(link, msg))
        elif isinstance(msg, Abort):
            self.pending = [p for p in self.pending if p.msg.request_id != msg.request_id]
        elif isinstance(msg, Generate):  # the router refuses chat on this model: a stale one
            error = "this worker serves an embedding model; it does not generate text"
            usage = Usage(len(msg.token_ids), 0, 0)
            link.send(TokenDelta(msg.request_id, (), "error", usage, error=error))
        elif isinstance(msg, Shutdown):
            log.info("shutdown requested by the router: %s", msg.reason or "no reason")
            self.stop()
        elif isinstance(msg, RegisterAck) and not msg.accepted:
            self.stop()

    def _turn(self) -> None:
        """Embed the requests that fit one turn, together; answer each."""
        taken, count = [], 0
        while self.pending and (not taken or count + self._next_size() <= MAX_TURN_INPUTS):
            taken.append(self.pending.pop(0))
            count += len(taken[-1].msg.inputs)
        inputs = [ids for p in taken for ids in p.msg.inputs]
        try:
            vectors = self.embedder.vectors(inputs)
        except Exception as exc:  # a request must end with an answer, never hang
            log.exception("embedding %d inputs failed", len(inputs))
            for p in taken:
                p.link.send(Embeddings(p.msg.request_id, error=f"embedding failed: {exc}"))
            return
        start = 0
        for p in taken:
            rows = vectors[start : start + len(p.msg.inputs)]
            start += len(p.msg.inputs)
            p.link.send(self._answer(p.msg, rows))

    def _next_size(self) -> int:
        return len(self.pending[0].msg.inputs)

    def _answer(self, msg: Embed, rows) -> Embeddings:
        if msg.dimensions and not (self.spec.matryoshka or msg.dimensions == self.spec.dimensions):
            return Embeddings(msg.request_id, error="this model does not truncate its vectors")
        finished = finish(rows, self.spec.normalize, msg.dimensions)
        tokens = sum(len(ids) for ids in msg.inputs)
        self.prompt_tokens += tokens
        self.served += 1
        return Embeddings(msg.request_id, tuple(row.tobytes() for row in finished), tokens)

    def _heartbeat(self) -> Heartbeat:
        return Heartbeat(
            worker_id=self.worker_id,
            running=0,
            waiting=len(self.pending),
            free_blocks=0,
            total_blocks=0,
            cached_blocks=0,
            hit_tokens=0,
            prompt_tokens=self.prompt_tokens,
            loop_turns=self.turns,
        )


def serve_embeddings(model_dir, spec: EmbeddingSpec, worker, model, config, worker_id, setup):
    """Load `model_dir` as an embedding model and serve it until told to stop (worker/cli.py)."""
    import signal

    from worker.embed.trunk import load_trunk

    trunk = load_trunk(model_dir, spec, config.compute_dtype)
    server = EmbedLoop(
        Embedder(trunk, spec),
        worker.router,
        worker_id,
        model.name,
        setup,
        watchdog_s=worker.watchdog_s,
    )
    log.info(
        "%s: embedding model %s (%s pooling, %d dimensions%s, %s)",
        worker_id,
        model.name,
        spec.pooling,
        spec.dimensions,
        ", Matryoshka" if spec.matryoshka else "",
        "encoder" if spec.encoder else "decoder",
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: server.stop())
    return server.serve_forever()
