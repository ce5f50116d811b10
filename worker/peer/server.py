"""This worker's KV endpoint: a ROUTER socket on a thread of its own.

Probes are answered on that thread. A FetchBlocks needs the MLX pool, which only the engine
thread may read: it is queued, the engine thread serves it between steps (`serve_pending`) and
hands the reply back; the encoding and the send happen here, so the step loop never waits on
the network. A frame that is not a valid request is dropped (logged and counted), and the
server goes on serving.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

import zmq

from shared.kv_transfer import (
    MAX_PROBE_BYTES,
    FetchBlocks,
    FetchReply,
    Probe,
    ProbeReply,
    ProtocolError,
    decode,
    encode,
    reply_frames,
)

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 64 * 1024 * 1024  # a FetchBlocks carries token ids, not K/V


class PeerServer:
    """Binds `bind` (a port of 0: a free one) at construction; `endpoint` is where peers
    connect. `wake()` is called (from the server thread) when a fetch waits to be served."""

    def __init__(
        self,
        ctx: zmq.Context,
        bind: str,
        wake: Callable[[], None],
        configure: Callable[[zmq.Socket], object] | None = None,
    ):
        self.ctx, self.wake = ctx, wake
        self.requests: queue.Queue[tuple[bytes, FetchBlocks]] = queue.Queue()
        self.replies: queue.Queue[tuple[bytes, object]] = queue.Queue()
        self.refused = 0  # frames that were not valid requests
        self._sock = ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, MAX_REQUEST_BYTES)
        self._keep = configure(self._sock) if configure else None  # a CURVE authenticator
        host, _, port = bind.rpartition(":")
        self._sock.bind(f"{host}:*" if port == "0" else bind)
        self.endpoint = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._signal_addr = f"inproc://kv-peer-{id(self)}"
        self._signal = ctx.socket(zmq.PULL)
        self._signal.bind(self._signal_addr)
        self._push = threading.local()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kv-peer-server", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        push = getattr(self._push, "socket", None)
        if push is not None:
            push.close(linger=0)
        if self._keep is not None:
            self._keep.stop()

    # ---- engine thread ----------------------------------------------------------------

    def serve_pending(self, serve: Callable[[FetchBlocks], FetchReply]) -> int:
        """Answer the queued fetches with `serve` (on the engine thread); how many."""
        served = 0
        while True:
            try:
                identity, req = self.requests.get_nowait()
            except queue.Empty:
                return served
            try:
                reply = serve(req)
            except Exception as exc:  # a bug here must not take the engine down
                log.exception("serving a peer's fetch failed")
                reply = FetchReply(req.request_id, "", "", error=f"holder error: {exc}")
            self._reply(identity, reply)
            served += 1

    def _reply(self, identity: bytes, reply) -> None:
        self.replies.put((identity, reply))
        push = getattr(self._push, "socket", None)
        if push is None:
            push = self._push.socket = self.ctx.socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, 0)
            push.connect(self._signal_addr)
        push.send(b"")

    # ---- the server thread ------------------------------------------------------------

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._signal, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                for sock, _ in poller.poll(timeout=100):
                    if sock is self._signal:
                        self._signal.recv()
                        self._send_replies()
                    else:
                        self._receive(self._sock.recv_multipart())
        finally:
            self._sock.close(linger=0)
            self._signal.close(linger=0)

    def _send_replies(self) -> None:
        while True:
            try:
                identity, reply = self.replies.get_nowait()
            except queue.Empty:
                return
            try:
                frames = reply_frames(reply) if isinstance(reply, FetchReply) else [encode(reply)]
                self._sock.send_multipart([identity, *frames], copy=False)
            except zmq.ZMQError as exc:  # the asker is gone
                log.info("a peer's reply was not sent: %s", exc)

    def _receive(self, frames: list[bytes]) -> None:
        identity = frames[0]
        try:
            if len(frames) != 2:
                raise ProtocolError(f"expected one frame, got {len(frames) - 1}")
            msg = decode(frames[1])
        except ProtocolError as exc:
            self.refused += 1
            log.warning("refused a malformed frame on the KV channel: %s", exc)
            self._sock.send_multipart([identity, encode(FetchReply("", "", "", error=str(exc)))])
            return
        if isinstance(msg, Probe):
            size = min(max(msg.reply_bytes, 0), MAX_PROBE_BYTES)
            self._sock.send_multipart([identity, encode(ProbeReply(msg.request_id, bytes(size)))])
        elif isinstance(msg, FetchBlocks):
            self.requests.put((identity, msg))
            self.wake()
        else:
            self.refused += 1
            log.warning("refused an unexpected %s on the KV channel", type(msg).__name__)
