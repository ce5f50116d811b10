"""Image requests made ready off the engine thread.

Decoding an image, the image processor and the M-RoPE index are host work of tens of
milliseconds an image; on the engine thread they would hold up the step in flight. The worker
loop hands a Generate with images to an `ImagePreparer`, whose threads run the preparation
(`Engine.intake.prepare`) and give the request back, ready or refused, through `ready()`; only
then does the loop queue it in the engine. Requests without images never wait here.
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from shared.sampling import InvalidRequest

if TYPE_CHECKING:
    from shared.protocol import Generate
    from worker.vision.encoder import PreparedImages

log = logging.getLogger(__name__)

PREPARE_THREADS = 2  # images of different requests decode side by side (PIL, numpy free the GIL)

Prepared = tuple["Generate", "PreparedImages | None | InvalidRequest"]


class ImagePreparer:
    """Runs `prepare(msg)` for Generate messages on its own threads; `ready()` gives each
    back once, with what it made or the InvalidRequest that refuses it. A request aborted
    meanwhile (`cancel`) is never given back."""

    def __init__(
        self,
        prepare: Callable[[Generate], PreparedImages | None],
        on_ready: Callable[[], None],
        threads: int = PREPARE_THREADS,
    ):
        self._prepare, self._on_ready = prepare, on_ready
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="images")
        self._pending: dict[str, Generate] = {}  # by request id; touched by the loop only
        self._done: queue.SimpleQueue[Prepared] = queue.SimpleQueue()

    def submit(self, msg: Generate) -> None:
        self._pending[msg.request_id] = msg
        self._pool.submit(self._run, msg)

    def preparing(self, request_id: str) -> bool:
        return request_id in self._pending

    def cancel(self, request_id: str) -> bool:
        """Forget a request being prepared (its result is dropped); False if none is."""
        return self._pending.pop(request_id, None) is not None

    def ready(self) -> list[Prepared]:
        """The requests prepared since the last call, in the order they finished."""
        out = []
        while True:
            try:
                msg, result = self._done.get_nowait()
            except queue.Empty:
                return out
            if self._pending.get(msg.request_id) is msg:
                del self._pending[msg.request_id]
                out.append((msg, result))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _run(self, msg: Generate) -> None:
        try:
            result: PreparedImages | None | InvalidRequest = self._prepare(msg)
        except InvalidRequest as exc:
            result = exc
        except Exception as exc:  # a processor's own bug on an odd image: that request alone
            log.exception("preparing the images of %s failed", msg.request_id)
            result = InvalidRequest(f"the images could not be prepared: {exc}")
        self._done.put((msg, result))
        self._on_ready()
