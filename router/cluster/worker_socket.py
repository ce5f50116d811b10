"""The router's ZeroMQ ROUTER socket: decoded messages in, fire-and-forget sends out."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

import zmq
import zmq.asyncio

from shared import curve
from shared.protocol import MAX_FRAME_BYTES, Message, ProtocolError, decode, encode

log = logging.getLogger(__name__)


class WorkerSocket:
    """Binds a ROUTER socket; workers connect DEALER sockets, one frame per message.

    With `curve` = (router secret key file, folder of authorized worker public keys), the
    socket is a CURVE server that admits only those workers; without it, `bind` must be a
    loopback address (curve.CurveError otherwise). Create inside the running event loop."""

    def __init__(
        self,
        bind: str,
        on_unreachable: Callable[[bytes], None],
        curve_files: tuple[Path, Path] | None = None,
    ):
        curve.require_curve(bind, curve_files is not None, "the router's worker socket")
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        # Sending to a worker that is gone raises EHOSTUNREACH instead of dropping silently.
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._sock.setsockopt(zmq.LINGER, 0)
        # A peer sending a bigger frame is disconnected before it is buffered.
        self._sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        self._auth = None
        try:
            if curve_files is not None:
                self._auth = curve.configure_server(self._sock, *curve_files)
            self._sock.bind(bind)
        except BaseException:
            self.close()
            raise
        self.endpoint: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._on_unreachable = on_unreachable

    def send(self, identity: bytes, msg: Message) -> None:
        """Queue `msg` for the worker; a failure is reported through on_unreachable."""
        try:
            future = self._sock.send_multipart([identity, encode(msg)])
        except zmq.ZMQError as e:
            self._unreachable(identity, e)
            return
        future.add_done_callback(lambda f: self._check_sent(identity, f))

    async def receive(self, handle: Callable[[bytes, Message], None]) -> None:
        """Forever: decode each frame and hand it to `handle`; malformed frames are dropped."""
        while True:
            frames = await self._sock.recv_multipart()
            if len(frames) != 2:
                log.warning("dropped a message of %d frames (want identity + payload)", len(frames))
                continue
            identity, payload = frames
            try:
                msg = decode(payload)
            except ProtocolError as e:
                log.warning("dropped a malformed frame from %r: %s", identity, e)
                continue
            try:
                handle(identity, msg)
            except Exception:  # a bug in one handler must not stop the receive loop
                log.exception("error handling %s from %r", type(msg).__name__, identity)

    def close(self) -> None:
        if self._auth is not None:
            self._auth.stop()
        self._sock.close(linger=0)
        self._ctx.term()

    def _check_sent(self, identity: bytes, future: asyncio.Future) -> None:
        if not future.cancelled() and future.exception() is not None:
            self._unreachable(identity, future.exception())

    def _unreachable(self, identity: bytes, error: BaseException) -> None:
        log.warning("worker %r unreachable: %s", identity, error)
        # Deferred: the caller may be in the middle of changing routing state.
        asyncio.get_running_loop().call_soon(self._on_unreachable, identity)
