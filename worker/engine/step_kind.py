"""A step's plan (`StepPlan`: which sequences decode, which prefill chunks run, and how the
step goes through the model), the plain data each of its forwards hands the runner
(`forward_input`), and which forwards a step's rows go through: the fold rule, and the packing
of prefill chunks.

A step has decode rows (one token each) and prefill chunks. Every forward reads every weight
once; what differs is where each chunk's tokens go:

- folded into the decode forward (MIXED): each token is a one-token row that gathers its own
  context's keys, a shared prefix once per group where the shared-prefix attention path reads
  it once (`worker.attention.shared_prefix.gathered_keys`: the same grouping, host ints only);
- into a prefill forward: one row per chunk, right-padded to the longest chunk of that
  forward. That forward costs a weight pass; its padding costs token slots computed for
  nothing; each row gathers its context once.

`plan_step` prices the choices (`ForwardCosts`) and takes the cheapest: which chunks fold
(cheapest first), and how the others are grouped into padded forwards (by length, a new
forward only where the padding it saves costs more than a weight pass). A chat admission (a
~50-token suffix after a cached system prompt) gathers a few thousand keys folded, about a
weight pass: it folds. A cold prompt's 256-token chunk would gather ~33k keys folded: it gets
a prefill forward of its own, and the chat suffixes beside it are not padded to 256.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from mlx.utils import tree_flatten

from worker.attention.shared_prefix import gathered_keys
from worker.engine.sequence import Sequence, Status
from worker.runner.plan import Forward, ForwardRequest, RequestKey, StepKind

if TYPE_CHECKING:
    import mlx.nn as nn

    from worker.kv.block_pool import BlockPool


class PrefillChunk(NamedTuple):
    seq: Sequence
    num_tokens: int


class StepPlan(NamedTuple):
    """A step: `decode` rows and `prefill` chunks, the first `folded` of them one-token rows
    of the decode forward (or of a flat forward of their own when nothing decodes); the rest
    in padded prefill forwards of `groups` chunks each, in order (no groups: one forward)."""

    kind: StepKind
    decode: list[Sequence]
    prefill: list[PrefillChunk]
    preempted: list[Sequence]
    folded: int = 0
    groups: tuple[int, ...] = ()

    def split(self) -> list[StepPlan]:
        """The forwards this plan runs, in order: the decode forward (DECODE, or MIXED with
        its folded chunks), then each PREFILL forward."""
        if self.kind in (StepKind.DECODE, StepKind.MIXED, StepKind.IDLE):
            return [self]
        folded, rest = self.prefill[: self.folded], self.prefill[self.folded :]
        parts = []
        if self.decode or folded:
            kind = StepKind.MIXED if folded else StepKind.DECODE
            parts.append(StepPlan(kind, self.decode, folded, []))
        at = 0
        for size in self.groups or (len(rest),):
            if size:
                parts.append(StepPlan(StepKind.PREFILL, [], rest[at : at + size], []))
            at += size
        return [parts[0]._replace(preempted=self.preempted), *parts[1:]] if parts else []

    def sequences(self) -> dict[RequestKey, Sequence]:
        """Its sequences by request key: how the runner's answers find them."""
        return {s.key: s for s in (*self.decode, *(c.seq for c in self.prefill))}


def forward_input(
    plan: StepPlan, finished: list[RequestKey], copies: list[tuple[int, int]] = ()
) -> Forward:
    """The plain data the runner is handed for one forward of `plan.split()` (the sequences'
    current tokens, positions and blocks), the requests `finished` and the blocks copied on
    write (`copies`) since the last one."""
    decode = [_decode_request(s) for s in plan.decode]
    prefill = [_prefill_request(s, n) for s, n in plan.prefill]
    return Forward(plan.kind, decode, prefill, finished, copies)


def _decode_request(seq: Sequence) -> ForwardRequest:
    """Its last token (none yet when it is the in-flight step's sample) and its drafts."""
    start = seq.num_computed
    return ForwardRequest(
        key=seq.key,
        tokens=[*seq.tokens[start : start + 1], *seq.draft],
        start=start,
        block_ids=seq.block_ids,
        sampling=seq.sampling,
        seed=seq.seed,
        state_slot=seq.state_slot,
        logits_state=seq.logits_state,
        images=seq.images,
    )


def _prefill_request(seq: Sequence, n: int) -> ForwardRequest:
    """The chunk of `n` prompt tokens after its computed ones; whether it ends the prompt
    (then it samples), and the prompt tokens its positions score (prompt logprobs)."""
    start = seq.num_computed
    scored_to = min(start + n, seq.prompt_len - 1) if seq.scores_prompt else start
    return ForwardRequest(
        key=seq.key,
        tokens=seq.tokens[start : start + n],
        start=start,
        block_ids=seq.block_ids,
        sampling=seq.sampling,
        seed=seq.seed,
        state_slot=seq.state_slot,
        samples=start + n == len(seq.tokens),
        prompt_targets=seq.tokens[start + 1 : scored_to + 1],
        logits_state=seq.logits_state,
        images=seq.images,
    )


# Rates measured on the reference machine (2-core x86-64, OpenBLAS). Not settings: they are
# facts about the hardware, and only their ratios decide anything.
# docs/benchmarks.md ("Repeats, medians and the roofline"): a 10-row float32 matmul streams
# its weights at 8.0 GB/s (the rate a decode-shaped forward reads them at; a plain read
# reaches 17 GB/s); sgemm peaks at 327 GFLOP/s.
WEIGHT_STREAM_BYTES_PER_S = 8.0e9
MATMUL_FLOPS_PER_S = 327e9
# K/V bytes gathered and attended per second by the "mlx" attention backend (`mlx_ops`'s and
# `shared_prefix`'s tables, scripts/bench_attention.py; 1.5 KB of K and V per key per layer of
# the default model): 12 decode rows over 4 tenants' 512-token prefixes, 2.0 ms per layer for
# ~3k keys (2.3 GB/s) shared, 3.3 ms for ~6.9k keys (3.2 GB/s) tiled; B=32 ctx 1024, 31.7 ms
# for 32k keys (1.6 GB/s). MLX's CPU gather is single-threaded: far below the weights' rate.
GATHER_BYTES_PER_S = 2.5e9


class ForwardCosts(NamedTuple):
    """Seconds of one weight pass, one gathered key (its K and V in every layer), and one
    token slot through the weights' matmuls (a padded one as much as a real one)."""

    weight_pass_s: float
    key_s: float
    token_s: float

    @classmethod
    def of(cls, weight_bytes: float, kv_bytes_per_key: float, flops_per_token: float):
        return cls(
            weight_bytes / WEIGHT_STREAM_BYTES_PER_S,
            kv_bytes_per_key / GATHER_BYTES_PER_S,
            flops_per_token / MATMUL_FLOPS_PER_S,
        )


# The default model (SmolLM2-135M, float32): 538 MB of weights, 269 MFLOP per token, 46 KB of
# K/V per key (30 layers x 3 KV heads x 64 x 4 bytes, K and V). A weight pass then costs as
# much as ~2.9k gathered keys or ~82 token slots. A scheduler without a model uses these.
REFERENCE_COSTS = ForwardCosts.of(538e6, 46_080, 269e6)


def forward_costs(model: nn.Module, pool: BlockPool) -> ForwardCosts:
    """The costs of `model`'s forwards over `pool`. FLOPs per token: 2 per parameter (packed
    quantized weights count their words: their FLOPs are underestimated)."""
    params = [v for _, v in tree_flatten(model.parameters())]
    return ForwardCosts.of(
        sum(v.nbytes for v in params), pool.bytes_per_token, 2 * sum(v.size for v in params)
    )


def plan_step(
    decode: list[Sequence],
    prefill: list[PrefillChunk],
    preempted: list[Sequence],
    costs: ForwardCosts,
    block_size: int,
    states: bool | None = None,
) -> StepPlan:
    """The step's plan: the cheapest number of chunks to fold (cheapest first), the rest in
    padded prefill forwards grouped by length.

    `states` (a hybrid model's recurrent layers) not None: nothing folds (a recurrent state
    takes a row's tokens in order, and a folded token is a row of its own), and with `states`
    False (layers that do not honour right padding) a prefill forward holds chunks of one
    length only."""
    if not prefill:
        return StepPlan(StepKind.DECODE if decode else StepKind.IDLE, decode, [], preempted)
    if states is not None:
        groups = pack(prefill, costs) if states else _equal_lengths(prefill)
        kind = StepKind.SEPARATE if decode else StepKind.PREFILL
        chunks = [c for g in groups for c in g]
        return StepPlan(kind, decode, chunks, preempted, 0, tuple(len(g) for g in groups))
    tables: list[list[int]] = []
    lengths: list[int] = []
    for seq in decode:
        for i in range(1 + len(seq.draft)):  # each draft is a one-token row too
            tables.append(seq.block_ids)
            lengths.append(seq.num_computed + 1 + i)
    base = gathered_keys(tables, lengths, block_size)
    order = sorted(prefill, key=lambda c: _fold_proxy(c, block_size))
    best_cost, best_k = prefill_cost(pack(order, costs), costs), 0
    for k, chunk in enumerate(order, 1):
        start = chunk.seq.num_computed
        tables.extend([chunk.seq.block_ids] * chunk.num_tokens)
        lengths.extend(range(start + 1, start + chunk.num_tokens + 1))
        fold = (gathered_keys(tables, lengths, block_size) - base) * costs.key_s
        if not decode:
            fold += costs.weight_pass_s  # the folded rows make a forward of their own
        if fold >= best_cost:
            break  # folding more only gathers more
        cost = fold + prefill_cost(pack(order[k:], costs), costs)
        if cost < best_cost:
            best_cost, best_k = cost, k
    groups = pack(order[best_k:], costs)
    chunks = order[:best_k] + [c for g in groups for c in g]
    if not decode:
        kind = StepKind.PREFILL
    else:
        kind = StepKind.MIXED if best_k == len(prefill) else StepKind.SEPARATE
    return StepPlan(kind, decode, chunks, preempted, best_k, tuple(len(g) for g in groups))


def pack(chunks: list[PrefillChunk], costs: ForwardCosts) -> list[list[PrefillChunk]]:
    """Chunks in padded forwards, longest first: a chunk joins the forward before it unless
    its padding there (token slots and keys) would cost more than a weight pass."""
    groups: list[list[PrefillChunk]] = []
    for chunk in sorted(chunks, key=lambda c: -c.num_tokens):
        if groups:
            waste = groups[-1][0].num_tokens - chunk.num_tokens
            if waste * (costs.token_s + costs.key_s) <= costs.weight_pass_s:
                groups[-1].append(chunk)
                continue
        groups.append([chunk])
    return groups


def _equal_lengths(chunks: list[PrefillChunk]) -> list[list[PrefillChunk]]:
    by_length: dict[int, list[PrefillChunk]] = {}
    for chunk in chunks:
        by_length.setdefault(chunk.num_tokens, []).append(chunk)
    return list(by_length.values())


def prefill_cost(groups: list[list[PrefillChunk]], costs: ForwardCosts) -> float:
    """Seconds the padded forwards cost beyond their real tokens: a weight pass each, their
    padding, and the keys each row gathers (its context up to the forward's width)."""
    total = 0.0
    for group in groups:
        width = group[0].num_tokens
        total += costs.weight_pass_s
        total += costs.token_s * sum(width - c.num_tokens for c in group)
        total += costs.key_s * sum(c.seq.num_computed + width for c in group)
    return total


def _fold_proxy(chunk: PrefillChunk, block_size: int) -> int:
    """A cheap guess at the keys a chunk gathers folded, to try the cheapest first: its
    computed prefix once, and each row's keys after its last whole block."""
    start, n = chunk.seq.num_computed, chunk.num_tokens
    return start + n * (start % block_size + n)


def padding_tokens(plan: StepPlan) -> tuple[int, int]:
    """(prompt tokens, token slots) of one forward of `plan.split()`: slots count the padding
    of a PREFILL forward's rows up to its longest (a MIXED forward's rows are unpadded)."""
    real = sum(c.num_tokens for c in plan.prefill)
    if plan.kind is not StepKind.PREFILL or not plan.prefill:
        return real, real
    return real, len(plan.prefill) * max(c.num_tokens for c in plan.prefill)


def still_running(part: StepPlan) -> StepPlan:
    """`part` of a step less the sequences no longer RUNNING: a failed earlier part (the decode
    half of a SEPARATE step) ended its requests, every choice of them, and freed their blocks.
    IDLE when nothing is left."""
    decode = [s for s in part.decode if s.status is Status.RUNNING]
    prefill = [c for c in part.prefill if c.seq.status is Status.RUNNING]
    kind = part.kind if decode or prefill else StepKind.IDLE
    return part._replace(kind=kind, decode=decode, prefill=prefill)
