"""The worker <-> worker KV channel (issue 22): a worker fetches a run of a prompt's KV blocks
from a peer that holds them, and measures the link to each peer.

A peer's KV endpoint is a ZeroMQ ROUTER socket (Register.kv_endpoint); the fetching side
talks to it with a DEALER socket, one request and one reply at a time. Blocks travel as the
pool stores them (worker/kv/block_io.py): raw K/V bytes per block with their chained hashes
(shared/hashing.py), a checksum over all of them, the model fingerprint and the block layout;
a receiver refuses a reply whose fingerprint, layout, hashes or checksum differ from its own.

A FetchReply travels as several ZeroMQ frames: the message with `blocks` empty, then one frame
per block (`reply_frames` / `with_block_frames`): the K/V bytes are never copied into msgpack
(a 2k-token prefix of the default model is 94 MB: packing it cost 0.1-0.5 s), they go out
zero-copy from the holder's host copy and are read in place by the receiver. A reply that
carries its blocks inside the message (one frame) is read as well.
"""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass

from shared.wire import Codec, ProtocolError

__all__ = [
    "ProtocolError",
    "decode",
    "encode",
    "blocks_checksum",
    "KV_CODEC",
    "reply_frames",
    "with_block_frames",
]


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


def blocks_checksum(blocks: tuple | list) -> str:
    """CRC-32 over the blocks' bytes in order, with their lengths: catches corrupted or
    truncated payloads (twice blake2b's speed over a 94 MB reply; what a peer may send on
    purpose is checked by fingerprint, layout, hashes and sizes)."""
    crc = 0
    for block in blocks:
        crc = zlib.crc32(len(block).to_bytes(8, "little"), crc)
        crc = zlib.crc32(block, crc)
    return f"crc32:{crc:08x}"


def reply_frames(reply: FetchReply) -> list:
    """The frames a FetchReply goes out as: the message without its blocks, then the blocks
    (any buffer: bytes, or a byte view of the holder's host copy)."""
    return [encode(dataclasses.replace(reply, blocks=())), *reply.blocks]


def with_block_frames(reply, frames: list) -> object:
    """The reply decoded from the first frame, with the blocks of the frames after it."""
    if frames and isinstance(reply, FetchReply):
        if reply.blocks:
            raise ProtocolError("a FetchReply with blocks both inside and after it")
        return dataclasses.replace(reply, blocks=tuple(frames))
    if frames:
        raise ProtocolError(f"{type(reply).__name__} followed by {len(frames)} frames")
    return reply
