"""One routing decision: the candidates a policy chooses among, what each holds or can pull.

Candidates are the model's healthy workers that decode (role "both" or "decode"; "prefill"
workers only compute prompts for others, router.routing.disagg). Every healthy worker of the
model with a KV endpoint can be the holder a candidate pulls from, if it holds the same kind of
blocks (router.cluster.registry `layout_key`; the prefix index keeps each worker's blocks apart,
so a worker of another K/V layout never counts as holding a prompt for another).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from router.routing.policy import Candidate, Policy
from router.routing.transfer import PullPlan, plan_pull
from shared.hashing import hash_blocks
from shared.protocol import PullHint

if TYPE_CHECKING:
    from router.cluster.registry import WorkerState
    from router.routing.affinity import PrefixAffinity
    from router.routing.prefix_index import PrefixIndex

# how a routed prompt's cached prefix is served (the routing-decisions metric's `kind`)
LOCAL_HIT, PULL, RECOMPUTE = "local_hit", "pull", "recompute"


@dataclass(frozen=True, slots=True)
class Choice:
    worker: WorkerState
    hashes: list[int]  # the prompt's block hashes at the worker's block size
    matched: int  # leading blocks it holds
    pull: PullPlan | None = None  # fetch more from a peer first

    @property
    def kind(self) -> str:
        if self.pull is not None:
            return PULL
        return LOCAL_HIT if self.matched else RECOMPUTE

    @property
    def hint(self) -> PullHint | None:
        if self.pull is None:
            return None
        return PullHint(self.pull.holder, self.pull.kv_endpoint, self.pull.blocks)


def decoders(workers: Sequence[WorkerState]) -> list[WorkerState]:
    """The workers that take whole requests: all but the "prefill" ones (all of them if
    every worker is a prefill worker, so that a misconfigured fleet still serves)."""
    decoding = [w for w in workers if w.role != "prefill"]
    return decoding or list(workers)


def choose(
    policy: Policy,
    index: PrefixIndex,
    affinity: PrefixAffinity,
    token_ids: Sequence[int],
    workers: Sequence[WorkerState],
    cache_key: str | None = None,
    pulls: bool = True,
    batch_rows: Mapping[str, int] | None = None,
) -> Choice:
    """Route a prompt among `workers` (the model's healthy ones, every role): the policy
    picks among the decoders, each priced with the best pull open to it (`pulls`), each
    with its `batch_rows` (a batch's lines in flight there, by worker id; none if absent)."""
    candidates_of = decoders(workers)
    sizes = {w.block_size for w in workers}
    hashes = {size: hash_blocks(token_ids, size) for size in sizes}
    matched: dict[str, int] = {}
    confirmed: dict[str, int] = {}
    for size, size_hashes in hashes.items():
        same_size = [w.worker_id for w in workers if w.block_size == size]
        matched.update(index.match(size_hashes, same_size))
        if pulls:
            confirmed.update(index.match(size_hashes, same_size, confirmed=True))
    holders = [(w, confirmed[w.worker_id]) for w in workers if confirmed.get(w.worker_id)]
    plans = {
        w.worker_id: plan_pull(w, matched[w.worker_id], holders) if holders else None
        for w in candidates_of
    }
    sticky = {affinity.lookup(h) for h in hashes.values()}
    keyed = affinity.lookup_key(cache_key)
    candidates = [
        Candidate(
            w.worker_id,
            w.load,
            matched[w.worker_id],
            len(hashes[w.block_size]),
            affinity=w.worker_id in sticky or w.worker_id == keyed,
            eviction_rate=w.eviction_rate,
            keyed=w.worker_id == keyed,
            pull_blocks=plan.gained if (plan := plans[w.worker_id]) else 0,
            pull_ratio=plan.ratio if plan else 1.0,
            batch_rows=batch_rows.get(w.worker_id, 0) if batch_rows else 0,
        )
        for w in candidates_of
    ]
    chosen = policy.choose(candidates)
    worker = next(w for w in candidates_of if w.worker_id == chosen.worker_id)
    return Choice(worker, hashes[worker.block_size], chosen.matched_blocks, plans[worker.worker_id])
