"""Disaggregated prefill and decode: a prefill worker computes the prompt, a decoder pulls it.

A prompt with fewer than `prefill_min_tokens` uncached tokens skips the prefill leg: the
decoder computes it in about one chunk, which stalls its batch less than a pull costs.

When a model has workers of role "prefill" as well as workers that decode ("decode" or
"both"), a new request goes first to the least loaded prefill worker as a `prefill_only`
Generate; that worker caches the prompt's full blocks and answers one delta with
finish_reason "prefilled". The router then routes the request among the decoders as usual
(router.routing.choose) and tells the chosen one to pull the prompt's blocks from the prefill
worker (Generate.pull), whatever the measured link: the operator chose to split the two. A
prefill that fails, times out (`prefill_timeout_s`) or whose worker is lost sends the request
to a decoder without a pull: it computes the prompt itself. Prefill workers never decode;
decode workers never get prefill_only. The client's stream does not change: the job's events
start with the decoder's first tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from shared.hashing import hash_blocks
from shared.protocol import Generate, PullHint

if TYPE_CHECKING:
    from router.cluster.registry import WorkerState
    from router.routing.choose import Choice
    from router.routing.job import Job
    from router.routing.prefix_index import PrefixIndex

PREFILLED = "prefilled"  # the finish_reason of a prefill_only request's one delta


def prefill_target(
    workers: Sequence[WorkerState], job: Job, index: PrefixIndex, min_tokens: int = 0
) -> WorkerState | None:
    """The prefill worker to send a new job to first; None: route it as usual (no prefill
    workers, or no decoders, or a job that already went through one or generated tokens, or
    fewer than `min_tokens` of its prompt are uncached on the decoder holding the most)."""
    if job.prefill_tried or job.generated:
        return None
    prefills = [w for w in workers if w.role == "prefill" and w.kv_endpoint]
    if not prefills or all(w.role == "prefill" for w in workers):
        return None
    best = min(prefills, key=lambda w: (w.load, w.worker_id))
    if len(job.prompt_ids) < best.block_size:
        return None  # not one full block to hand over
    if min_tokens > 0:
        hashes = hash_blocks(job.prompt_ids, best.block_size)
        held = index.match(hashes, [w.worker_id for w in workers if w.role != "prefill"])
        if len(job.prompt_ids) - max(held.values(), default=0) * best.block_size < min_tokens:
            return None  # a decoder computes it in about a chunk: no prefill leg
    return best


def prefill_message(job: Job) -> Generate:
    """The prefill leg's Generate (its own wire id: `job.prefilling` is set)."""
    return Generate(
        job.wire_id,
        job.prompt_ids,
        job.sampling,
        prefill_only=True,
        images=job.images,
        priority=job.priority,
    )


def handover_from(worker: WorkerState | None, job: Job) -> PullHint | None:
    """Where the decoder fetches the prompt: the prefill worker that answered "prefilled"."""
    if worker is None:
        return None
    return PullHint(worker.worker_id, worker.kv_endpoint, len(job.prompt_ids) // worker.block_size)


def decode_hint(choice: Choice, job: Job, prefill: WorkerState | None) -> PullHint | None:
    """The pull to attach to the decode leg: the cost model's if it found one, else the
    handover, where the decoder holds the same kind of blocks and lacks some of them."""
    if choice.pull is not None:
        return choice.hint
    handover = job.handover
    if handover is None or prefill is None or prefill.layout_key != choice.worker.layout_key:
        return None
    return handover if choice.matched < handover.num_blocks else None
