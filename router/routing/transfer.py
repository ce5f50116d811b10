"""The fleet cache's cost model: recompute a cached prefix, or pull it from the worker holding it.

A worker that holds fewer of a prompt's leading blocks than another worker of the same layout
(router.cluster.registry `layout_key`: same model, block size, K/V layout, TP split) can either
recompute the blocks it lacks or fetch them from that holder over the KV channel:

    recompute_s = tokens / the candidate's measured prefill rate
    pull_s      = blocks x bytes per block / the measured link rate holder -> candidate + latency

The cheaper wins, and the candidate's estimated time to first token is its queue wait + that +
the uncached rest at its prefill rate. The policy (router.routing.policy) prices all of it in
its own unit, uncached blocks: a pulled block counts `pull_s / recompute_s` of one.

Rates are measured by the workers and reported in heartbeats. Until they are:
- a worker's prefill rate is DEFAULT_PREFILL_TOKENS_PER_S, a deliberately high guess (it makes
  recomputing look cheap, so an unmeasured worker is not sent pulls on an optimistic guess);
- a link with no rate measured in either direction is never pulled over (recompute). A rate
  measured one way stands for the other (links between two Macs or on loopback are symmetric
  enough for a choice between ~10 s of prefill and a fraction of a second of transfer).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from router.cluster.registry import WorkerState
    from shared.protocol import LinkRate

# Prompt tokens a second a worker is assumed to prefill until it has measured its own rate.
# High on purpose: the larger it is, the cheaper recompute looks and the fewer pulls are made
# on a guess (this CPU prefills the default model at a few hundred tokens a second).
DEFAULT_PREFILL_TOKENS_PER_S = 2000.0
# A pull must save at least this share of the recompute time: a transfer that barely wins on
# paper is not worth the extra moving part (and its fallback costs a recompute anyway).
MIN_PULL_SAVING = 0.2


@dataclass(frozen=True, slots=True)
class PullPlan:
    """Fetch the prompt's first `blocks` full blocks from `holder` (those the candidate holds
    already are skipped by the worker); `gained` of them are new to the candidate."""

    holder: str
    kv_endpoint: str
    blocks: int
    gained: int
    pull_s: float
    recompute_s: float

    @property
    def ratio(self) -> float:
        """The pull's cost as a share of recomputing the same blocks (< 1)."""
        return self.pull_s / self.recompute_s if self.recompute_s > 0 else 1.0


def prefill_rate(worker: WorkerState) -> float:
    """Prompt tokens a second: measured, else DEFAULT_PREFILL_TOKENS_PER_S."""
    measured = worker.prefill_tokens_per_s
    return measured if measured > 0 else DEFAULT_PREFILL_TOKENS_PER_S


def link(dst: WorkerState, src: WorkerState) -> LinkRate | None:
    """The link src -> dst: what dst measured fetching from src, else what src measured
    fetching from dst (a -> b stands for b -> a); None: neither measured."""
    for rate in (dst.links.get(src.worker_id), src.links.get(dst.worker_id)):
        if rate is not None and rate.bytes_per_s > 0:
            return rate
    return None


def recompute_s(worker: WorkerState, blocks: int) -> float:
    return blocks * worker.block_size / prefill_rate(worker)


def pull_s(dst: WorkerState, src: WorkerState, blocks: int) -> float | None:
    """Seconds to fetch `blocks` blocks from src into dst; None: the link or the block size
    in bytes is unknown, or the two hold different kinds of blocks."""
    rate = link(dst, src)
    if rate is None or dst.block_bytes <= 0 or dst.layout_key != src.layout_key:
        return None
    return blocks * dst.block_bytes / rate.bytes_per_s + rate.latency_s


def plan_pull(
    candidate: WorkerState, matched: int, holders: Iterable[tuple[WorkerState, int]]
) -> PullPlan | None:
    """The pull that saves `candidate` the most time over recomputing, from the holders
    (each with the prompt's leading blocks it holds); None: recomputing is as cheap."""
    best: PullPlan | None = None
    for holder, held in holders:
        if holder is candidate or held <= matched or not holder.kv_endpoint:
            continue
        gained = held - matched
        pull = pull_s(candidate, holder, gained)
        recompute = recompute_s(candidate, gained)
        if pull is None or pull > (1 - MIN_PULL_SAVING) * recompute:
            continue
        plan = PullPlan(holder.worker_id, holder.kv_endpoint, held, gained, pull, recompute)
        if best is None or plan.recompute_s - plan.pull_s > best.recompute_s - best.pull_s:
            best = plan
    return best
