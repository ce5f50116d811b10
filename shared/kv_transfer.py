"""The worker <-> worker KV channel (issue 22): a worker fetches a run of a prompt's KV blocks
from a peer that holds them, and measures the link to each peer.

A peer's KV endpoint is a ZeroMQ ROUTER socket (Register.kv_endpoint); the fetching side
talks to it with a DEALER socket, one request and one reply at a time. Blocks travel as the
pool stores them (worker/kv/block_io.py): raw K/V bytes per block with their chained hashes
(shared/hashing.py), a checksum over all of them, the model fingerprint and the block layout;
a receiver refuses a reply whose fingerprint, layout, hashes or checksum differ from its own.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from shared.wire import Codec, ProtocolError

__all__ = ["ProtocolError", "decode", "encode", "blocks_checksum", "KV_CODEC"]


@dataclass(frozen=True, slots=True)
class FetchBlocks:
    """Asks for the prompt's full blocks `start_block`.. (those the asker lacks): `token_ids`
    is the prompt up to the last wanted block, `block_hashes` the wanted blocks' chained
    hashes, `fingerprint` the asker's model fingerprint (a holder of another model answers
    nothing)."""

    request_id: str
    token_ids: tuple[int, ...]
    start_block: int
    block_hashes: tuple[int, ...]
    fingerprint: str


@dataclass(frozen=True, slots=True)
class FetchReply:
    """The longest run of the wanted blocks the holder has, from `start_block` on (possibly
    none), or `error` (why nothing: another model, a malformed request)."""

    request_id: str
    fingerprint: str
    layout: str  # the holder's block layout (repr of worker.kv.disk_store.BlockLayout)
    block_hashes: tuple[int, ...] = ()
    blocks: tuple[bytes, ...] = ()  # one payload per block, as the pool stores it
    checksum: str = ""  # blocks_checksum(blocks)
    error: str = ""


@dataclass(frozen=True, slots=True)
class Probe:
    """A link probe: the reply carries `reply_bytes` bytes (0: a latency probe)."""

    request_id: str
    reply_bytes: int = 0


@dataclass(frozen=True, slots=True)
class ProbeReply:
    request_id: str
    payload: bytes = b""


MAX_PROBE_BYTES = 16 * 1024 * 1024

# tags are the wire contract: never renumber, only add
KV_MESSAGES = {1: FetchBlocks, 2: FetchReply, 3: Probe, 4: ProbeReply}
# a reply holds a prefix's K/V (~92 MB for 2k tokens of the default model in float32)
KV_CODEC = Codec(KV_MESSAGES, max_frame_bytes=4 * 1024 * 1024 * 1024)
encode, decode = KV_CODEC.encode, KV_CODEC.decode


def blocks_checksum(blocks: tuple[bytes, ...] | list[bytes]) -> str:
    """blake2b-128 over the blocks' bytes in order, with their lengths."""
    digest = hashlib.blake2b(digest_size=16)
    for block in blocks:
        digest.update(len(block).to_bytes(8, "little"))
        digest.update(block)
    return digest.hexdigest()
