"""The KV manager's side of a hybrid model's recurrent state (`worker.state.StatePool`).

A running sequence owns a state slot from admission to its end (a preempted one gives it
back and starts again from a snapshot or from nothing). A prefix hit needs the states as they
were where the hit ends, so for these models a hit is the deepest matched block that has a
snapshot (`cut`); the K/V blocks past it are computed again with the states.

Where snapshots are taken decides what later prompts can hit (vLLM #45238), and each costs a
whole state, so a sequence takes at most three (four when its prompt ends on a block
boundary), those in its prompt at block boundaries its prefill chunks are cut to end on
(`chunk`):
- **where its prompt left the cached tree**, when the tree held K/V blocks there but no
  snapshot: the radix tree branches there, so that prefix is one that several prompts
  share (a system prompt, a document asked about twice); the next prompt that shares it hits
  all of it. No client has to mark anything, and it works the same on every API;
- **at its prompt's last whole block**: a chat's next turn extends this prompt, so the next
  turn computes only this turn's reply and its new message; and the same prompt sent again
  (which must compute its last token) hits the block before it. Where the prompt ends on a
  block boundary these are two blocks, both kept: a next turn whose history rewrites the reply
  from its start (Qwen 3 without the client's `reasoning_content`, gpt-oss without its
  analysis: scripts/history_reuse.py) leaves the reply right at the prompt's end;
- **at its reply's last whole block**, published when it ends with its reply's blocks: the
  next turn computes only its new message (and the reply's last partial block). Where a reply
  ends is not known ahead, so its decode copies its states into one kept slot each time it
  crosses a block boundary (`StatePool.keep`, overwritten each time): one state copy per
  block of output, 1/block_size of a state per token beside the state each decode step
  reads and writes anyway.
A snapshot per block is never kept: it would cost a state per block.
"""

from __future__ import annotations

import inspect
import logging
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from shared.hashing import hash_blocks
from shared.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    KVEvent,
    StateSnapshotsDropped,
    StateSnapshotsStored,
)
from worker.state import StatePool
from worker.state.pool import state_bytes

if TYPE_CHECKING:
    import mlx.nn as nn

    from worker.config import EngineConfig
    from worker.engine.sequence import Sequence
    from worker.runner.model_support import ModelShape
    from worker.runner.plan import RequestKey


log = logging.getLogger(__name__)


class NoStates:
    """A model without recurrent layers: every question answered as if there were none."""

    active = False

    def room(self, seq: Sequence, running: list[Sequence]) -> bool:
        return True

    def has_snapshot(self, block_hash: int) -> bool:
        return False

    def plan(self, seq: Sequence, start: int, kv_tokens: int) -> None: ...

    def unplan(self, seq: Sequence) -> None: ...

    def start(self, seq: Sequence, snapshot: int | None) -> None: ...

    def chunk(self, seq: Sequence, n: int, start: int | None = None) -> int:
        return n

    def computed(self, seq: Sequence) -> None: ...

    def fork(self, parent: Sequence, child: Sequence) -> None: ...

    def release(self, seq: Sequence) -> None: ...


class SequenceStates:
    """State slots and snapshots for the scheduler's sequences."""

    active = True

    def __init__(self, pool: StatePool, block_size: int, emit: Callable[[KVEvent], None]):
        self.pool, self.block_size, self._emit = pool, block_size, emit
        # per sequence: where a snapshot of its states is taken (block-aligned positions ->
        # the block's hash), and its states at the latest block boundary its decode crossed
        # (position, state slot)
        self.snapshot_at: dict[RequestKey, dict[int, int]] = {}
        self.kept: dict[RequestKey, tuple[int, int]] = {}
        pool.on_drop = lambda hashes: emit(StateSnapshotsDropped(tuple(hashes)))

    def room(self, seq: Sequence, running: list[Sequence]) -> bool:
        """Whether `seq` (and its n > 1 choices) can have state slots now, beside the
        choices running sequences have still to fork."""
        return self.pool.room() >= 1 + seq.forks + sum(s.forks for s in running)

    def has_snapshot(self, block_hash: int) -> bool:
        """Whether a snapshot of the states after the block `block_hash` ends is kept."""
        return block_hash in self.pool.snapshots

    def plan(self, seq: Sequence, start: int, kv_tokens: int) -> None:
        """Mutates: where `seq`, to be admitted at `start`, takes its snapshots."""
        bs, end = self.block_size, len(seq.tokens)
        last = (end - 1) // bs * bs  # the same prompt again hits up to here, at most
        # a next turn whose history leaves the reply where it began (a template dropping the
        # reasoning) hits the prompt's end: on a block boundary, `last` is a block short of it
        full = end if end % bs == 0 else last
        points = {p for p in (kv_tokens, last, full) if start < p}
        hashes = hash_blocks(seq.tokens[: max(points)], bs) if points else []
        self.snapshot_at[seq.key] = {p: hashes[p // bs - 1] for p in sorted(points)}

    def unplan(self, seq: Sequence) -> None:
        """Mutates: `seq` was not admitted after all: its snapshot points are dropped."""
        self.snapshot_at.pop(seq.key, None)

    def records(self) -> set[RequestKey]:
        """The sequences it keeps snapshot points or a kept state for."""
        return set(self.snapshot_at) | set(self.kept)

    def start(self, seq: Sequence, snapshot: int | None) -> None:
        """Mutates: admitted `seq` gets its slot, from `snapshot` or zeros."""
        seq.state_slot = self.pool.allocate() if snapshot is None else self.pool.restore(snapshot)

    def chunk(self, seq: Sequence, n: int, start: int | None = None) -> int:
        """`n` prefill tokens from `start` (`seq.num_computed`) cut to end at its next
        snapshot point."""
        start = seq.num_computed if start is None else start
        return min([n, *(p - start for p in self.snapshot_at.get(seq.key, ()) if p > start)])

    def computed(self, seq: Sequence) -> None:
        """Mutates: after a forward (lazily, before the next is built); the snapshot where
        `seq`'s computed tokens now end, or past its prompt, at a block boundary, its states
        kept there in place of the ones kept at the previous boundary."""
        at, key = seq.num_computed, seq.key
        block_hash = self.snapshot_at.get(key, {}).pop(at, None)
        if block_hash is not None:
            if self.pool.snapshot(seq.state_slot, block_hash):
                self._emit(StateSnapshotsStored((block_hash,)))
        elif at % self.block_size == 0 and at >= seq.prompt_len:
            before = self.kept.pop(key, None)
            kept = self.pool.keep(seq.state_slot, before[1] if before else None)
            if kept is not None:
                self.kept[key] = (at, kept)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        child.state_slot = self.pool.fork(parent.state_slot)
        self.snapshot_at.pop(child.key, None)

    def release(self, seq: Sequence) -> None:
        """Mutates: `seq` stops running (finished, aborted or preempted), after its computed
        blocks entered the cache: the states it kept become the snapshot after its last
        block there (the end of its reply), if that block did and no step still in flight
        (or failed: `Scheduler.drop`) wrote them."""
        kept_state = self.kept.pop(seq.key, None)
        if kept_state is not None:
            at, kept = kept_state
            if at <= min(seq.inserted_tokens, seq.num_computed - seq.num_in_flight):
                block_hash = hash_blocks(seq.tokens[:at], self.block_size)[-1]
                if self.pool.publish(kept, block_hash):
                    self._emit(StateSnapshotsStored((block_hash,)))
            else:
                self.pool.discard(kept)
        if seq.state_slot >= 0:
            self.pool.free(seq.state_slot)
        seq.state_slot = -1
        self.snapshot_at.pop(seq.key, None)

    def on_event(self, event: KVEvent) -> None:
        """The radix cache's news: blocks that left it take their snapshots along."""
        if isinstance(event, BlockRemoved):
            self.pool.forget(event.block_hashes)
        elif isinstance(event, AllBlocksCleared):
            self.pool.clear()


NO_STATES = NoStates()
States = NoStates | SequenceStates  # what the scheduler holds: `active` says which


# ---- at load (worker.engine.startup.sizing) ----


def plan_states(
    config: EngineConfig, shape: ModelShape, kv_bytes: int | None
) -> tuple[EngineConfig, int]:
    """A hybrid model's state slots out of the KV memory (at most half of it): one per
    running sequence (fewer running sequences if they do not fit) and `state_snapshots`;
    returns the config with both set, and the KV bytes left for the pool."""
    if not shape.recurrent:
        return config, kv_bytes or 0
    running, snapshots = config.max_running, config.state_snapshots
    snapshots = 2 * running if snapshots is None else snapshots
    if kv_bytes is not None:
        per = state_bytes(shape.states)
        fit = max(1, kv_bytes // 2 // per)
        if fit < running:
            log.warning(
                "%d sequences' states fit in half the KV memory: max_running %d -> %d",
                fit,
                running,
                fit,
            )
        running = min(running, fit)
        snapshots = min(snapshots, fit - running)
        kv_bytes -= (running + snapshots) * per
    return replace(config, max_running=running, state_snapshots=snapshots), kv_bytes or 0


def make_states(config: EngineConfig, shape: ModelShape, emit) -> SequenceStates | None:
    """The state pool of a hybrid model (`plan_states` sized it), None for others."""
    if not shape.recurrent:
        return None
    slots = config.max_running + (config.state_snapshots or 0)
    log.info(
        "recurrent states: %d layers, %.1f MiB per sequence, %d slots (%d for snapshots)",
        len(shape.states),
        state_bytes(shape.states) / 2**20,
        slots,
        config.state_snapshots or 0,
    )
    return SequenceStates(
        StatePool(list(shape.states), slots, config.max_running), config.block_size, emit
    )


def honours_padding(model: nn.Module) -> bool:
    """Whether the model's recurrent layers keep each row's state where its real tokens end
    when rows are right-padded (mlx-lm's `ArraysCache.lengths`, which its batched generation
    sets): read off the model's own source, as no forward can show it without a reference."""
    source = inspect.getsource(sys.modules[type(model).__module__])
    return "cache.lengths" in source
