"""Requests routed to each worker lately: an exponentially decayed count over about
`per_worker` x (number of workers) recent requests.

Under KV pressure cache_aware keeps each prefix on one worker; this is what bounds the load
that costs: a worker whose recent count is over the mean by more than the allowed imbalance
takes no more prefixes it does not hold. Counts of requests (what the 30% load-balance target
measures), not in-flight load, which swings with every long prefill.
"""

from __future__ import annotations

from collections.abc import Iterable

_RESCALE_AT = 1e200


class RecentShares:
    def __init__(self, per_worker: int = 32):
        self._per_worker = per_worker
        self._weight = 1.0  # the weight of the next request; older ones decay relative to it
        self._counts: dict[str, float] = {}

    def recent(self, worker_id: str) -> float:
        """Decayed requests routed to `worker_id` (no mutation)."""
        return self._counts.get(worker_id, 0.0) / self._weight

    def mean(self, worker_ids: Iterable[str]) -> float:
        ids = list(worker_ids)
        return sum(self.recent(w) for w in ids) / max(1, len(ids))

    def add(self, worker_id: str, num_workers: int) -> None:
        """Mutates: one more request went to `worker_id`; every count decays a step."""
        window = self._per_worker * max(1, num_workers)
        self._weight /= 1 - 1 / window
        self._counts[worker_id] = self._counts.get(worker_id, 0.0) + self._weight
        if self._weight > _RESCALE_AT:
            self._counts = {w: c / self._weight for w, c in self._counts.items()}
            self._weight = 1.0
