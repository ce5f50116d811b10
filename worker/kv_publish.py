"""The worker's KV events in vLLM's format on a ZeroMQ PUB socket (`--kv-events-publish`), so
an external KV-aware router that follows vLLM engines (NVIDIA Dynamo's ZMQ relay, llm-d's
KV-cache manager, SGLang's gateway) can follow this worker's prefix cache as well.

The wire format is vLLM's `KVEventBatch` as its msgspec structs encode it with `array_like`
(what those consumers decode): each message is three frames, `topic`, an 8-byte big-endian
sequence number, and the msgpack payload `[ts, [event, ...], data_parallel_rank]`, where an
event is a tagged array:

    ["BlockStored", [block_hash, ...], parent_block_hash | None, [token_id, ...],
     block_size, lora_id (None), medium ("GPU"), lora_name (None)]
    ["BlockRemoved", [block_hash, ...], medium ("GPU")]
    ["AllBlocksCleared"]

A first block's parent is None (ours is ROOT_PARENT_HASH). With `--kv-events-replay`, a ROUTER
socket answers `[identity, b"", start_seq (8 bytes big-endian)]` with every buffered batch
from that sequence on, `[identity, b"", seq, payload]` each, then `seq = -1` and an empty
payload, as vLLM's publisher does. Sending runs on its own thread; the step loop only queues.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Iterable

import msgpack
import zmq

from shared.hashing import ROOT_PARENT_HASH
from shared.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    BlockWindowsDropped,
    KVEvent,
)

log = logging.getLogger(__name__)

MEDIUM = "GPU"  # vLLM's name for the engine's own KV memory (ours: the MLX pool)
END_SEQ = (-1).to_bytes(8, "big", signed=True)
REPLAY_BUFFER = 10_000  # batches kept for replay
QUEUE_LIMIT = 100_000  # batches waiting to be sent; beyond it the oldest are dropped


def vllm_event(event: KVEvent) -> list:
    """One of our KV events as vLLM's array-encoded KVCacheEvent."""
    if isinstance(event, BlockStored):
        parent = None if event.parent_hash == ROOT_PARENT_HASH else event.parent_hash
        tokens = list(event.token_ids)
        return [
            "BlockStored",
            [event.block_hash],
            parent,
            tokens,
            event.block_size,
            None,
            MEDIUM,
            None,
        ]
    if isinstance(event, BlockRemoved):
        return ["BlockRemoved", list(event.block_hashes), MEDIUM]
    if isinstance(event, AllBlocksCleared):
        return ["AllBlocksCleared"]
    raise TypeError(f"not a KV event: {type(event).__name__}")


def vllm_batch(events: Iterable[KVEvent], ts: float, rank: int = 0) -> bytes:
    """A KVEventBatch payload: `[ts, [event, ...], data_parallel_rank]`."""
    # vLLM's format has no window-pages event (its own hit rule lives in its scheduler)
    kept = [vllm_event(e) for e in events if not isinstance(e, BlockWindowsDropped)]
    return msgpack.packb([ts, kept, rank], use_bin_type=True)


class VllmEventPublisher:
    """Publishes KV events as vLLM does, from a thread of its own."""

    def __init__(self, endpoint: str, replay_endpoint: str | None = None, topic: str | None = None):
        self.endpoint, self.replay_endpoint = endpoint, replay_endpoint
        self._topic = (topic or "").encode()
        self._queue: queue.Queue[tuple[float, list[KVEvent]] | None] = queue.Queue(QUEUE_LIMIT)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=REPLAY_BUFFER)
        self._ctx = zmq.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.set_hwm(100_000)
        self._pub.bind(endpoint)  # raises ZMQError (address in use...) here, at start
        # the address bound: a port given as `*` is chosen now
        self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self._replay = None
        if replay_endpoint:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.bind(replay_endpoint)
            self.replay_endpoint = self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
        self.sent = 0  # batches published
        self._thread = threading.Thread(target=self._run, name="kv-publish", daemon=True)
        self._thread.start()
        log.info(
            "KV events in vLLM's format on %s%s",
            self.endpoint,
            f" (replay on {self.replay_endpoint})" if replay_endpoint else "",
        )

    def publish(self, events: list[KVEvent]) -> None:
        """Queue one batch (never blocks the step loop: a full queue drops its oldest)."""
        if not events:
            return
        item = (time.time(), list(events))
        while True:
            try:
                self._queue.put_nowait(item)
                return
            except queue.Full:
                with contextlib.suppress(queue.Empty):
                    self._queue.get_nowait()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=2)
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(linger=0)

    def _run(self) -> None:
        seq = 0
        while True:
            if self._replay is not None and self._replay.poll(0):
                self._serve_replay()
            try:
                item = self._queue.get(timeout=0.05)
            except queue.Empty:
                continue
            if item is None:
                return
            ts, events = item
            try:
                payload = vllm_batch(events, ts)
                self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
            except zmq.ZMQError as exc:  # the socket is gone (closing): nothing to send to
                log.warning("KV event publishing stopped: %s", exc)
                return
            self._buffer.append((seq, payload))
            seq += 1
            self.sent += 1

    def _serve_replay(self) -> None:
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            log.warning("ignored a malformed KV event replay request (%d frames)", len(frames))
            return
        client, _, start = frames
        start_seq = int.from_bytes(start, "big")
        for seq, payload in list(self._buffer):
            if seq >= start_seq:
                self._replay.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", END_SEQ, b""))
