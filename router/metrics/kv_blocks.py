"""A worker's KV blocks by state, from its heartbeat: what /v1/cluster, /metrics and the
fleet page show, so an operator can tell blocks in use from blocks the cache keeps."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from shared.protocol import Heartbeat


class KVBlocks(NamedTuple):
    """A worker's KV blocks, each in one state: `free + held + cached_full + cached_partial ==
    total`. `held`: blocks running requests hold beyond what the cache keeps (the rest of a
    heartbeat's count; 0 on an idle worker); `cached_full`: the prefix tree's full blocks
    (what the router's index mirrors); `cached_partial`: the partial tails kept beside them."""

    total: int
    free: int
    held: int
    cached_full: int
    cached_partial: int

    @classmethod
    def of(cls, hb: Heartbeat) -> KVBlocks:
        cached = hb.cached_blocks + hb.cached_partial_blocks
        held = max(0, hb.total_blocks - hb.free_blocks - cached)
        return cls(
            hb.total_blocks, hb.free_blocks, held, hb.cached_blocks, hb.cached_partial_blocks
        )
