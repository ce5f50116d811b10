"""The engine thread's side of peer transfer: read the blocks a peer asks for, and import the
blocks fetched from a peer into this worker's pool and prefix cache.

Both run between engine steps (the MLX pool is the engine thread's), through the same block
reads and writes as the disk tier (worker/kv/block_io.py). Serving holds nothing past the read;
an import allocates its blocks, writes them, inserts them in the radix cache (which emits the
usual BlockStored events) and drops its own hold, so they stay cached and evictable.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from shared.hashing import hash_blocks
from shared.kv_transfer import FetchBlocks, FetchReply, blocks_checksum
from worker.engine.caches import PrefixEvicted
from worker.kv.block_io import model_fingerprint
from worker.kv.errors import OutOfBlocksError

if TYPE_CHECKING:
    from worker.engine.engine import Engine

log = logging.getLogger(__name__)


class PullRejected(Exception):
    """Fetched blocks this worker will not use; the request is computed instead."""


class PeerBlocks:
    """Reads and writes the blocks of one engine for its peers (engine thread only)."""

    def __init__(self, engine: Engine):
        self.engine, self.kv = engine, engine.kv  # the KV manager: blocks read and stored
        self.block_size = self.kv.block_size
        self.layout = self.kv.block_layout()
        self.layout_text = f"{self.layout!r} {self.layout.quant} {self.layout.row_bytes}"
        self.fingerprint = model_fingerprint(engine.model, self.layout)
        self.served_blocks = 0  # cumulative, to peers

    def wanted(self, request_id: str, prompt, num_blocks: int) -> FetchBlocks | None:
        """The fetch for the prompt's first `num_blocks` full blocks that are not cached here
        (None: all are)."""
        bs = self.block_size
        end = min(num_blocks, len(prompt) // bs)
        start = self.kv.prefix_length(prompt[: end * bs]) // bs
        if start >= end or not self.engine.config.enable_prefix_cache:
            return None
        tokens = tuple(prompt[: end * bs])
        hashes = tuple(hash_blocks(tokens, bs)[start:])
        return FetchBlocks(request_id, tokens, start, hashes, self.fingerprint)

    # ---- serving a peer ---------------------------------------------------------------

    def serve(self, req: FetchBlocks) -> FetchReply:
        """The longest run of the asked blocks held here, from `req.start_block` on."""
        reply = FetchReply(req.request_id, self.fingerprint, self.layout_text)
        bs, start = self.block_size, req.start_block
        if req.fingerprint != self.fingerprint:
            return _error(reply, "another model or KV layout (fingerprint differs)")
        end = start + len(req.block_hashes)
        if start < 0 or not req.block_hashes or len(req.token_ids) != end * bs:
            return _error(reply, "malformed FetchBlocks (token ids and block hashes disagree)")
        held = self.kv.prefix_length(req.token_ids) // bs
        if held <= start:
            return reply
        hashes = hash_blocks(req.token_ids[: held * bs], bs)[start:]
        if tuple(hashes) != req.block_hashes[: len(hashes)]:
            return _error(reply, "block hashes differ from this worker's")
        payloads = self.kv.read_cached(req.token_ids[: held * bs], start)
        # byte views of the host copy: they go out as frames of their own, zero-copy
        blocks = tuple(memoryview(np.ascontiguousarray(p)).cast("B") for p in payloads)
        self.served_blocks += len(blocks)
        return FetchReply(
            req.request_id,
            self.fingerprint,
            self.layout_text,
            tuple(hashes),
            blocks,
            blocks_checksum(blocks),
        )

    # ---- importing a fetch ------------------------------------------------------------

    def check(self, req: FetchBlocks, reply: FetchReply) -> None:
        """Raises PullRejected unless `reply` holds blocks for `req` of this model."""
        if reply.error:
            raise PullRejected(f"the peer refused: {reply.error}")
        if reply.request_id != req.request_id:
            raise PullRejected("a reply to another fetch")
        if reply.fingerprint != self.fingerprint or reply.layout != self.layout_text:
            raise PullRejected("the peer's model or KV layout differs (fingerprint)")
        n = len(reply.blocks)
        if not n:
            raise PullRejected("the peer holds none of the blocks")
        if len(reply.block_hashes) != n or reply.block_hashes != req.block_hashes[:n]:
            raise PullRejected("block hashes differ from the prompt's")
        if any(len(b) != self.layout.nbytes for b in reply.blocks):
            raise PullRejected("a block of the wrong size")
        if blocks_checksum(reply.blocks) != reply.checksum:
            raise PullRejected("checksum mismatch")

    def load(self, req: FetchBlocks, reply: FetchReply) -> int:
        """Check `reply`, then write its blocks (those still missing) into the pool and the
        prefix cache; the number of blocks imported. Raises PullRejected."""
        self.check(req, reply)
        bs, n = self.block_size, len(reply.blocks)
        tokens = req.token_ids[: (req.start_block + n) * bs]
        dtype, shape = self.layout.dtype, self.layout.shape
        payloads = [np.frombuffer(b, dtype).reshape(shape) for b in reply.blocks]
        try:
            return self.kv.import_blocks(tokens, req.start_block, payloads)
        except OutOfBlocksError as exc:
            raise PullRejected(str(exc)) from exc
        except PrefixEvicted as exc:
            raise PullRejected(
                "the prefix before the fetched blocks was evicted meanwhile"
            ) from exc


def _error(reply: FetchReply, why: str) -> FetchReply:
    log.warning("refused a peer's fetch: %s", why)
    return FetchReply(reply.request_id, reply.fingerprint, reply.layout, error=why)
