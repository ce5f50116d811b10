"""Tensor-parallel worker groups: one model replica served by K ranks over `mx.distributed`.

Every rank loads the model and shards it with mlx-lm's `model.shard(group)` (attention heads
and MLP columns split K ways; the all_sum after o_proj and down_proj is inside the forward).
Every rank holds a BlockPool of its own KV heads (num_kv_heads / K) with the same number of
blocks and the same K/V layout (the leader sends both: `PoolPlan`), so block ids and tables
mean the same on all ranks; quantized K/V (`--kv-bits`) is quantized per head vector, so a
head's K/V is the same whichever rank holds it. Only rank 0 (the leader) has the
scheduler, the radix cache and the router link; before each forward it broadcasts the rows
of the forward (`StepWire`) and every rank runs that forward, in the same order. Rank 0 alone
projects onto the vocabulary and samples.

The broadcast is `all_sum` over int32 arrays to which the followers add zeros: a header
[op, host ints, device tokens] and then the payload. A pipelined decode step's inputs are
the previous step's samples, still on the device: the leader appends them to the payload
lazily (no host read), and its own forward reads them back out of the all_sum's result, which
also orders that collective before the forward's own.

No rank waits in a collective forever: a `Watchdog` exits the process when its thread has not
checked in for `timeout_s` (the leader checks in at every forward and sends a keepalive each
second when idle; followers check in at every message), and a lost peer makes the ring
backend raise, on which a rank exits too. The group then stops as a whole and the launcher
restarts it as a whole.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING

import mlx.core as mx
import mlx.nn as nn

from shared.protocol import GroupReport, RankReport
from shared.tensor_parallel import GroupError, check_divides
from worker.attention import PREFIX_KV_BYTES, PrefixKV
from worker.engine.caches.mirror import MirrorKV
from worker.kv.block_pool import BlockPool
from worker.runner.layer_cache import CacheLayout
from worker.runner.model_runner import LayerProbe, LayerTimes, ModelRunner, Row, StepOutput
from worker.runner.model_support import COVERED_ARCHITECTURES, UnsupportedModel, model_type
from worker.tp.pool_plan import PoolPlan

if TYPE_CHECKING:
    from worker.runner.plan import Forward

log = logging.getLogger(__name__)

KEEPALIVE_EVERY_S = 1.0
DEFAULT_TIMEOUT_S = 60.0  # longest a rank may go without a message or a finished step
STARTUP_ALLOWANCE_S = 600.0  # before the first check-in (see Watchdog)
EXIT_GROUP_LOST = 3
HOST_BYTES = 64  # exit status of a rank whose group broke (peer lost or stalled)


class Op(IntEnum):
    STEP = 1
    KEEPALIVE = 2
    STOP = 3


# ---- the group ------------------------------------------------------------------------


def init_group(expected_size: int | None = None) -> mx.distributed.Group:
    """Join the ring named by MLX_RANK / MLX_HOSTFILE (as `mlx.launch` or `launch-cluster
    --tp` set them); raise GroupError when there is no such group or it has the wrong size."""
    try:
        group = mx.distributed.init(backend="ring", strict=True)
    except RuntimeError as exc:
        raise GroupError(f"could not join the tensor-parallel ring: {exc}") from exc
    if expected_size is not None and group.size() != expected_size:
        raise GroupError(f"the ring has {group.size()} ranks, expected {expected_size}")
    return group


def gather_ranks(group: mx.distributed.Group) -> GroupReport:
    """Every rank's host and pid, on every rank (one all_sum; each rank fills its own row)."""
    rows = mx.zeros((group.size(), 1 + HOST_BYTES), dtype=mx.int32)
    host = list(socket.gethostname().encode()[:HOST_BYTES])
    mine = mx.array([os.getpid(), *host, *[0] * (HOST_BYTES - len(host))], dtype=mx.int32)
    rows[group.rank()] = mine
    table = mx.distributed.all_sum(rows, group=group).tolist()
    ranks = tuple(
        RankReport(r, bytes(b for b in row[1:] if b).decode(errors="replace"), row[0])
        for r, row in enumerate(table)
    )
    return GroupReport(group.size(), ranks)


def check_shardable(model: nn.Module, size: int) -> None:
    """Raise GroupError unless mlx-lm can shard `model` `size` ways over our paged KV."""
    name = model_type(model)
    if not callable(getattr(model, "shard", None)):
        raise GroupError(f"model type {name!r} has no tensor-parallel shard() in mlx-lm")
    if name not in COVERED_ARCHITECTURES:
        raise GroupError(
            f"model type {name!r} is not among the architectures tested over the paged KV "
            f"({', '.join(sorted(COVERED_ARCHITECTURES))}); tensor parallel needs one of them"
        )
    check_divides(vars(model.args), size)


def shard(model: nn.Module, group: mx.distributed.Group) -> nn.Module:
    check_shardable(model, group.size())
    model.shard(group)
    model.tp_shard = f"rank {group.rank()} of {group.size()}"  # in its KV fingerprint
    mx.eval(model.parameters())
    return model


# ---- what crosses the wire --------------------------------------------------------------


@dataclass(frozen=True)
class WireStep:
    """One forward as the followers need it: its rows, whether anything samples (then the
    final norm's all_sum runs too), and the block copies (copy-on-write) to do first."""

    rows: list[Row]
    samples: bool
    copies: list[tuple[int, int]]


def encode_step(step: WireStep) -> list[int]:
    ints = [int(step.samples), len(step.copies)]
    for src, dst in step.copies:
        ints += [src, dst]
    ints.append(len(step.rows))
    for tokens, start, blocks, *_ in step.rows:  # (TP serves no states, no images)
        ints += [len(tokens), start, len(blocks), *tokens, *blocks]
    return ints


def decode_step(ints: list[int], device_tokens: list[int]) -> WireStep:
    """The inverse of `encode_step`; `device_tokens`, when any, are the rows' one input each."""
    samples, num_copies = bool(ints[0]), ints[1]
    copies = [(ints[2 + 2 * i], ints[3 + 2 * i]) for i in range(num_copies)]
    at = 2 + 2 * num_copies
    num_rows, at = ints[at], at + 1
    rows = []
    for r in range(num_rows):
        ntok, start, nblocks = ints[at : at + 3]
        at += 3
        tokens = [device_tokens[r]] if device_tokens else ints[at : at + ntok]
        rows.append(Row(tokens, start, ints[at + ntok : at + ntok + nblocks]))
        at += ntok + nblocks
    return WireStep(rows, samples, copies)


class StepWire:
    """The leader's side of the broadcast; `receive` is the followers'."""

    def __init__(self, group: mx.distributed.Group):
        self.group = group

    def _all_sum(self, x: mx.array) -> mx.array:
        return mx.distributed.all_sum(x, group=self.group)

    def send(self, op: Op, ints: list[int] = (), device_tokens: mx.array | None = None):
        """Broadcast `op` and `ints`; with `device_tokens` (lazy, nothing read on the host)
        return them as the all_sum delivered them, for the leader's forward to read."""
        n_dev = 0 if device_tokens is None else device_tokens.size
        header = self._all_sum(mx.array([int(op), len(ints), n_dev], dtype=mx.int32))
        if not ints and device_tokens is None:
            mx.eval(header)
            return None
        body = mx.array(list(ints), dtype=mx.int32)
        if device_tokens is None:
            mx.eval(header)
            mx.eval(self._all_sum(body))
            return None
        body = mx.concatenate([body, device_tokens.astype(mx.int32).reshape(-1)])
        payload = self._all_sum(mx.depends(body, header))  # header first on every rank
        return payload[len(ints) :]

    def receive(self) -> tuple[Op, list[int], list[int]]:
        """A follower's next message: (op, host ints, device tokens)."""
        header = self._all_sum(mx.zeros((3,), dtype=mx.int32)).tolist()
        op, n_host, n_dev = header
        if n_host + n_dev == 0:
            return Op(op), [], []
        payload = self._all_sum(mx.zeros((n_host + n_dev,), dtype=mx.int32)).tolist()
        return Op(op), payload[:n_host], payload[n_host:]


# ---- liveness ---------------------------------------------------------------------------


class Watchdog:
    """Exit the process when the serving thread has not checked in for `timeout_s`: a rank
    stuck in a collective whose peer hangs (a dead peer makes the ring raise instead).

    Until the first check-in it allows `startup_s`: start-up forwards wait for the slowest
    rank's pool allocation (tens of GiB of zeros on a big Mac take a while)."""

    def __init__(self, timeout_s: float, what: str, startup_s: float = STARTUP_ALLOWANCE_S):
        self.timeout_s, self.what = timeout_s, what
        self._deadline = time.monotonic() + max(timeout_s, startup_s)
        threading.Thread(target=self._watch, name="tp-watchdog", daemon=True).start()

    def check_in(self) -> None:
        self._deadline = time.monotonic() + self.timeout_s

    def _watch(self) -> None:
        while True:
            time.sleep(min(1.0, self.timeout_s / 4))
            if time.monotonic() > self._deadline:
                log.error("%s: no progress for %.0fs; leaving the group", self.what, self.timeout_s)
                os._exit(EXIT_GROUP_LOST)


def group_lost(what: str, exc: BaseException) -> None:
    """A collective failed (a peer is gone): the group cannot go on; exit now."""
    log.error("%s: the tensor-parallel group is broken (%s); exiting", what, exc)
    logging.shutdown()
    os._exit(EXIT_GROUP_LOST)


# ---- the leader (rank 0) ---------------------------------------------------------------


class LeaderRunner:
    """A ModelRunner for rank 0: broadcasts each forward's rows, then runs it like any. Its
    followers run every layer paged, full attention, one cache entry each: it refuses a model
    whose layout is another (`refuse_unless_plain`)."""

    tensor_parallel = True

    def __init__(self, inner: ModelRunner, wire: StepWire, watchdog: Watchdog):
        self.refuse_unless_plain(inner.layout)
        self.inner, self.wire, self.watchdog = inner, wire, watchdog
        self._copies: list[tuple[int, int]] = []  # not sent yet (a forward may fail first)
        self._last_keepalive = time.monotonic()

    @classmethod
    def factory(cls, group: mx.distributed.Group, watchdog: Watchdog):
        """A `make_runner` for Engine: tells the followers the pool's size on creation."""

        def make(
            model,
            pool: BlockPool,
            scratch_block: int,
            backend,
            layout: CacheLayout,
            states=None,
            kept_prefix_bytes: int = PREFIX_KV_BYTES,
        ) -> LeaderRunner:
            wire = StepWire(group)
            try:
                wire.send(Op.STEP, PoolPlan.of(pool, scratch_block).encode())
            except RuntimeError as exc:
                group_lost("rank 0", exc)
            inner = ModelRunner(
                model, pool, scratch_block, backend, layout, states, kept_prefix_bytes
            )
            return cls(inner, wire, watchdog)

        return make

    @property
    def prefix_kv(self) -> PrefixKV:
        """The leader's kept prefix K/V (what `Engine.phases` reports)."""
        return self.inner.prefix_kv

    @staticmethod
    def refuse_unless_plain(layout: CacheLayout) -> None:
        """Raise UnsupportedModel unless every cache slot of `layout` is full attention, paged,
        and one cache entry of its own: what the followers run."""
        if any(layout.gathered) or any(k.window is not None for k in layout.kinds):
            raise UnsupportedModel(
                "tensor-parallel groups serve only models whose every layer is plain full "
                "attention; serve this one with one worker per model replica"
            )
        if layout.entries.lists:
            raise UnsupportedModel(
                "tensor-parallel groups do not serve models with several caches per layer "
                "(CacheList) yet; serve this one with one worker per model replica"
            )

    def probe(self, plan: Forward) -> LayerProbe:
        """The load-time probe (`ModelRunner.probe`), its forward broadcast like any."""
        return self.inner.probe(plan, self.run)

    def settle_modes(self, gathered: list[bool]) -> None:
        """The modes the probe decided, refused unless every layer stays paged."""
        self.refuse_unless_plain(self.inner.layout.with_modes(gathered))
        self.inner.settle_modes(gathered)

    def run(
        self, plan: Forward, device_tokens: mx.array | None = None, times: LayerTimes | None = None
    ) -> StepOutput:
        self._copies += plan.copies  # made on the leader's pool by its KV manager
        rows, points = self.inner.plan_rows(plan, device_tokens is not None)
        step = WireStep(rows, bool(points.requests or points.prompt), self._copies)
        self._copies = []
        self.watchdog.check_in()
        try:
            sent = self.wire.send(Op.STEP, encode_step(step), device_tokens)
        except RuntimeError as exc:
            group_lost("rank 0", exc)
        return self.inner.run(plan, sent, times)

    def keepalive(self) -> None:
        """Called when idle: tells the followers the leader lives (at most once a second)."""
        self.watchdog.check_in()
        if time.monotonic() - self._last_keepalive < KEEPALIVE_EVERY_S:
            return
        try:
            self.wire.send(Op.KEEPALIVE)
        except RuntimeError as exc:
            group_lost("rank 0", exc)
        self._last_keepalive = time.monotonic()

    def stop(self) -> None:
        """Tell the followers to exit (a clean shutdown of the group)."""
        try:
            self.wire.send(Op.STOP)
        except RuntimeError as exc:
            log.warning("could not tell the other ranks to stop: %s", exc)


# ---- the followers (ranks > 0) ----------------------------------------------------------


def serve_follower(runner: ModelRunner, wire: StepWire, watchdog: Watchdog) -> int:
    """Run the leader's forwards until it says stop (0) or the group breaks (exits)."""
    kv = MirrorKV(runner.pool)  # the follower's pool, changed only as the leader's was
    rank = f"rank {wire.group.rank()}"
    while True:
        watchdog.check_in()
        try:
            op, ints, device_tokens = wire.receive()
            if op is Op.STOP:
                log.info("%s: the leader stopped the group", rank)
                return 0
            if op is Op.STEP:
                run_step(runner, kv, decode_step(ints, device_tokens))
        except RuntimeError as exc:
            group_lost(rank, exc)


def run_step(runner: ModelRunner, kv: MirrorKV, step: WireStep) -> None:
    kv.repeat_copies(step.copies)  # the leader's copies on write, on this rank's heads
    hidden, _ = runner.forward(step.rows)
    pool = runner.pool
    # The leader evaluates the hidden states only when it samples: the same collectives here.
    mx.eval([hidden, *pool.k, *pool.v] if step.samples else [*pool.k, *pool.v])
    del hidden
