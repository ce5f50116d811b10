"""Run an mlx-lm model over the paged KV pool, without forking mlx-lm's model files.

The seam (see DESIGN.md): attention in mlx-lm models does rope(offset=cache.offset) ->
cache.update_and_fetch(k, v) -> base.scaled_dot_product_attention(q, k, v, cache=cache).
We hand each layer a `PagedLayerCache`, whose update_and_fetch scatters the new K/V into the
pool by slot id, and patch `scaled_dot_product_attention` (`worker.attention.hook`, installed
when a runner is made and checked per model by `worker.runner.model_support`) so that, for our cache,
it runs the forward's `AttentionPlan` over the sequence's blocks instead of the dense K/V.
SwiGLU and RoPE get faster CPU paths inside our forwards (`worker.runner.model_hooks`); what
those hooks need of a forward they read off its `ForwardContext` (`worker.attention.forward`).

`ModelRunner.run(forward)` is the whole device side of a step: the batch layout built once
from host ints, one attention plan per forward, the forward, and the only place tokens are
sampled. It is handed plain data (`worker.runner.plan.Forward`: request ids, tokens, block
tables) and answers by request id; the rng keys are its own, kept by request. Nothing in it
reads device data on the host, so a step can be built while the previous one is still running
(`tests/unit/worker/engine/test_no_host_sync.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import mlx.core as mx
import mlx.nn as nn

from shared.models.vision import IMAGE_KEY_BASE
from worker.attention import (
    PREFIX_KV_BYTES,
    AttentionBackend,
    ForwardContext,
    PrefixKV,
    building,
    install_attention_hook,
)
from worker.runner.layer_cache import CacheLayout, ForwardGroups, LayerCache, LayerTimes
from worker.runner.layer_groups import grouped_scores
from worker.runner.model_hooks import install_model_hooks
from worker.runner.plan import Forward, ForwardRequest, RequestKey, StepKind
from worker.runner.sampler import PromptLogprobs, TokenLogprobs, prompt_logprobs, sample
from worker.runner.state_cache import StateCache
from worker.runner.trunk import Trunk
from worker.vision.deepstack import scattered_adds
from worker.vision.mrope import forward_positions

if TYPE_CHECKING:
    import numpy as np

    from worker.kv.block_pool import BlockPool
    from worker.state import StatePool


class Row(NamedTuple):
    """One row of a forward: `tokens` fed at positions `start`.. of a sequence's blocks."""

    tokens: list[int]
    start: int
    block_ids: list[int]
    slot: int = -1  # its state slot (hybrid models: `worker.state`)
    # image tokens among `tokens`: their columns and embeddings (worker/vision)
    image: tuple[list[int], mx.array] | None = None
    # M-RoPE models' image prompts (and their decodes): the tokens' 3-D positions (3, n)
    positions: np.ndarray | None = None


@dataclass(frozen=True)
class BatchLayout:
    """Where one forward's tokens go in the pool and what each query may attend to.

    Rows are sequences, right-padded to a common length L. Padding tokens write to a scratch
    block and their outputs are ignored; `context_lengths` counts them as if real so that
    every row's queries are its last L positions (the paged-attention contract), while the
    causal mask keeps real queries off the padding keys. Built from host ints only.
    """

    tokens: mx.array  # (B, L) int32
    offsets: mx.array  # (B,) position of each row's first token
    write_slots: mx.array  # (B * L,) pool slot of each token
    block_tables: mx.array  # (B, max_blocks)
    context_lengths: list[int]  # (B,) offsets + L, host ints
    last_index: list[int]  # (B,) index in L of each row's last real token, host ints


def build_layout(rows: list[Row], block_size: int, scratch_block: int) -> BatchLayout:
    width = max(len(r.tokens) for r in rows)
    tokens, offsets, slots, last = [], [], [], []
    for toks, start, blocks, *_ in rows:
        tokens.append(toks + [0] * (width - len(toks)))
        offsets.append(start)
        last.append(len(toks) - 1)
        for pos in range(start, start + len(toks)):
            slots.append(blocks[pos // block_size] * block_size + pos % block_size)
        slots.extend(scratch_block * block_size + i % block_size for i in range(width - len(toks)))
    max_blocks = max(-(-(r.start + width) // block_size) for r in rows)
    tables = [
        blocks[:max_blocks] + [scratch_block] * (max_blocks - len(blocks))
        for _, _, blocks, *_ in rows
    ]
    return BatchLayout(
        tokens=mx.array(tokens, dtype=mx.int32),
        offsets=mx.array(offsets, dtype=mx.int32),
        write_slots=mx.array(slots, dtype=mx.int32),
        block_tables=mx.array(tables, dtype=mx.int32),
        context_lengths=[start + width for start in offsets],
        last_index=last,
    )


class StepOutput(NamedTuple):
    """What one forward produced, still on the device until evaluated."""

    requests: list[RequestKey]  # the requests that sampled, in row order
    counts: list[int]  # tokens each sampled: 1, or 1 + its drafts (verified together)
    tokens: mx.array | None  # (sum(counts),) int32; None when none sampled
    logprobs: TokenLogprobs | None
    # Evaluating these runs the whole forward (every layer's K/V write included): the samples,
    # or with none, the pools themselves. Not kept past evaluation: a kept reference to a pool
    # array makes the next step's K/V scatter copy the whole pool (see `write_kv`).
    outputs: list[mx.array]
    prompt: PromptLogprobs | None = None  # of the sequences that asked (prefill steps only)


class Points(NamedTuple):
    """Where a forward's logits are read: (row, column) pairs, and the request of each."""

    rows: list[int]
    cols: list[int | None]  # None: the row's last real token
    requests: list[ForwardRequest]
    # prompt logprobs asked for: (row, column, request, the prompt position scored there,
    # the prompt token at that position)
    prompt: list[tuple[int, int, ForwardRequest, int, int]]


class LayerProbe(NamedTuple):
    """What the layers of the load-time probe's forward did (`ModelRunner.probe`), as
    `decide_modes` reads it."""

    caches: list[LayerCache]  # per cache slot, what it was asked and how it attended
    uncached_attention: int  # layers that attended K/V passed along, not their cache's


class ModelRunner:
    """Forward passes of one model over a BlockPool, and the sampling of their tokens.

    `layout`: each cache slot's kind and mode, and where the slots sit among mlx-lm's cache
    entries (`ModelShape.layout`); the load-time probe settles the modes (`probe`,
    `settle_modes`). `states`: a hybrid model's recurrent layers' state pool.
    `kept_prefix_bytes`: what the attention may keep of gathered prefix K/V across ticks
    (`prefix_kv`, the runner's own: the worker's memory plan sizes it)."""

    tensor_parallel = False  # a tensor-parallel group's leader runner says True

    def __init__(
        self,
        model: nn.Module,
        pool: BlockPool,
        scratch_block: int,
        backend: AttentionBackend,
        layout: CacheLayout,
        states: StatePool | None = None,
        kept_prefix_bytes: int = PREFIX_KV_BYTES,
    ):
        if len(layout.kinds) != pool.num_layers:
            raise ValueError(f"{len(layout.kinds)} cache slots for a pool of {pool.num_layers}")
        install_attention_hook()
        self.trunk = Trunk(model)
        install_model_hooks(self.trunk.module)
        self.model, self.pool, self.scratch_block = model, pool, scratch_block
        self.backend, self.layout, self.states = backend, layout, states
        self.prefix_kv = PrefixKV(pool.versions, kept_prefix_bytes)
        self._head = self.trunk.head
        self.grouped_scores = grouped_scores(model, self.trunk.module)
        self._probes: list[LayerProbe] | None = None  # while the load-time probe runs
        # what a forward wrote that its samples may not read (states, snapshots, an
        # indexer's keys): evaluated with them
        self._written: list[mx.array] = []
        # each sampled (not greedy) request's rng key, split at every sample; dropped when the
        # engine says the request is over (`Forward.finished`)
        self._rng_keys: dict[RequestKey, mx.array] = {}

    def run(
        self, plan: Forward, device_tokens: mx.array | None = None, times: LayerTimes | None = None
    ) -> StepOutput:
        """Build and queue (lazily) the forward of `plan` and its sampling. Mutates only the
        sampling state of the requests that sample (their rng keys, their logits states).

        `device_tokens` (B,), with a DECODE plan: the rows' input tokens, still on the device
        (the previous step's samples); the rows then sit at their `start` and all sample.
        `times`: evaluate layer by layer and add up write and attention time (profiling).
        """
        for key in plan.finished:
            self._rng_keys.pop(key, None)
        rows, points = self.plan_rows(plan, device_tokens is not None)
        hidden, layout = self.forward(rows, device_tokens, times)
        prompt = self._score_prompts(hidden, points.prompt) if points.prompt else None
        if not points.requests:
            outputs = prompt.arrays() if prompt is not None else self.pool.k + self.pool.v
            outputs = outputs + self._written
            return StepOutput([], [], None, None, outputs, prompt)
        # The output projection at the sampling points only: projecting every prefill
        # position onto the vocabulary is wasted work.
        row_idx = mx.array(points.rows, dtype=mx.int32)
        cols = [layout.last_index[r] if c is None else c for r, c in zip(*points[:2], strict=True)]
        logits = self._head(hidden[row_idx, mx.array(cols, dtype=mx.int32)])
        requests = points.requests
        # a request with logit processors samples at one point per step (it never drafts)
        result, keys = sample(
            logits,
            [r.sampling for r in requests],
            [self._rng_key(r) for r in requests],
            [r.logits_state for r in requests],
        )
        for request, key in zip(requests, keys, strict=True):
            if key is not None:
                self._rng_keys[request.key] = key
        unique, counts = _runs([r.key for r in requests])
        outputs = [*result.arrays(), *(k for k in keys if k is not None), *self._written]
        if prompt is not None:
            outputs += prompt.arrays()
        return StepOutput(unique, counts, result.tokens, result.logprobs, outputs, prompt)

    def probe(
        self, plan: Forward, run: Callable[[Forward], StepOutput] | None = None
    ) -> LayerProbe:
        """The load-time probe (`worker.engine.startup.checks.check_model`): `plan` run with
        every cache slot gathered, and evaluated, by `run` (this runner's own; a
        tensor-parallel leader's broadcasts the forward first); what its layers did, for
        `decide_modes`. The modes stay as they were until `settle_modes`."""
        settled, self._probes = self.layout, []
        self.layout = settled.with_modes([True] * len(settled.kinds))
        try:
            mx.eval(*(run or self.run)(plan).outputs)
            return self._probes[-1]
        finally:
            self.layout, self._probes = settled, None

    def settle_modes(self, gathered: list[bool]) -> None:
        """Each cache slot's mode as the load-time probe decided it (True: gathered)."""
        self.layout = self.layout.with_modes(gathered)

    def _rng_key(self, request: ForwardRequest) -> mx.array | None:
        """`request`'s rng key: made from its seed at its first sample (none when greedy)."""
        key = self._rng_keys.get(request.key)
        if key is None and not request.sampling.greedy:
            key = mx.random.key(request.seed + request.key.choice)
        return key

    def _score_prompts(self, hidden: mx.array, points: list) -> PromptLogprobs:
        """Every asked-for prompt position of this forward through the output projection: the
        logprob of the prompt token after it (only the rows of requests that asked)."""
        rows, cols, requests, positions, targets = (list(x) for x in zip(*points, strict=True))
        at = hidden[mx.array(rows, dtype=mx.int32), mx.array(cols, dtype=mx.int32)]
        counts = [r.sampling.prompt_logprobs for r in requests]
        keys = [r.key for r in requests]
        return prompt_logprobs(self._head(at), targets, keys, positions, counts)

    def forward(
        self,
        rows: list[Row],
        device_tokens: mx.array | None = None,
        times: LayerTimes | None = None,
    ) -> tuple[mx.array, BatchLayout]:
        """The backbone's forward over `rows` (lazy): its hidden states (B, L, hidden) and the
        layout. `device_tokens` (B,), when given, replace the rows' one host token each."""
        layout = build_layout(rows, self.pool.block_size, self.scratch_block)
        tokens = layout.tokens
        if device_tokens is not None:
            tokens = device_tokens.astype(mx.int32).reshape(-1, 1)
        paged = {}  # per window sub-group, the layout over its pages (worker/kv/window_pages)
        if self.pool.pages is not None:
            for g, page_of in enumerate(self.pool.pages.page_of):
                scratch = page_of[self.scratch_block]
                paged_rows = [
                    Row(
                        r.tokens,
                        r.start,
                        [page_of[b] if page_of[b] >= 0 else scratch for b in r.block_ids],
                    )
                    for r in rows
                ]
                paged[g] = build_layout(paged_rows, self.pool.block_size, scratch)
        groups = ForwardGroups(
            self.pool,
            self.backend,
            layout,
            [r.block_ids for r in rows],
            paged,
            tokens.shape[1],
            self.grouped_scores,
            self.prefix_kv,
        )
        modes = zip(self.layout.kinds, self.layout.gathered, strict=True)
        caches = [
            groups.cache(i, kind, gathered, times) for i, (kind, gathered) in enumerate(modes)
        ]
        states = self._state_caches(rows, tokens.shape[1])
        embeddings, adds = self._embeddings(rows, tokens) if device_tokens is None else (None,) * 2
        at = forward_positions(
            [r.start for r in rows], [r.positions for r in rows], tokens.shape[1]
        )
        context = ForwardContext(layout.offsets, at, adds, queries=tokens.shape[1])
        with building(context):
            entries = self.layout.entries.of(caches, states)
            hidden = self.trunk.forward(tokens, entries, embeddings)
        if self._probes is not None:
            self._probes.append(LayerProbe(caches, context.uncached_attention))
        self._written = [a for c in states for a in c.write()]
        self._written += self.layout.entries.unread_writes(self.pool)
        if self.states is not None:  # snapshots taken since the last forward, evaluated now
            self._written += self.states.arrays.take_copies()
        return hidden, layout

    def _embeddings(self, rows: list[Row], tokens: mx.array) -> tuple:
        """Input embeddings with the rows' image tokens' put in, and with deepstack (image
        rows (n, 1 + layers, hidden): Qwen3-VL) each deepstack layer's addition; (None, None)
        when no row has any. Image keys (ids past the vocabulary) are embedded as token 0,
        then overwritten."""
        if all(r.image is None for r in rows):
            return None, None
        batch, width = tokens.shape
        embedded = self.trunk.embed(mx.where(tokens >= IMAGE_KEY_BASE, 0, tokens))
        at = [b * width + c for b, r in enumerate(rows) if r.image for c in r.image[0]]
        images = mx.concatenate([r.image[1] for r in rows if r.image]).astype(embedded.dtype)
        flat, index = embedded.reshape(batch * width, -1), mx.array(at, dtype=mx.int32)
        flat[index] = images if images.ndim == 2 else images[:, 0]
        adds = scattered_adds(images[:, 1:], index, batch, width) if images.ndim == 3 else None
        return flat.reshape(batch, width, -1), adds

    def _state_caches(self, rows: list[Row], width: int) -> list[StateCache]:
        """The recurrent layers' caches of one forward: the rows' slots gathered, and each
        row's real length where rows are padded."""
        if self.states is None:
            return []
        slots = [r.slot for r in rows]
        lengths = [len(r.tokens) for r in rows]
        padded = lengths if any(n != width for n in lengths) else None
        return [StateCache(self.states, s, slots, padded) for s in range(len(self.states.shapes))]

    def plan_rows(self, plan: Forward, on_device: bool) -> tuple[list[Row], Points]:
        """The rows of `plan` and where they sample. A decode row is its last token; its
        drafts are one-token rows after it (each samples: the drafts are verified), so the
        decode rows stay one-query rows (shared-prefix attention) and nothing is padded; in
        a MIXED plan every prefill token is its own one-token row too."""
        rows: list[Row] = []
        points = Points([], [], [], [])

        def add(row: Row, request: ForwardRequest, cols: list[int | None]) -> None:
            rows.append(row)
            for col in cols:
                points.rows.append(len(rows) - 1)
                points.cols.append(col)
                points.requests.append(request)

        flat = plan.kind is StepKind.MIXED
        for r in plan.decode:
            start, images = r.start, r.images
            for i, tok in enumerate([0] if on_device else r.tokens):
                at = images.rope_positions(start + i, 1) if images else None
                add(Row([tok], start + i, r.block_ids, r.state_slot, positions=at), r, [0])
        for r in plan.prefill:
            start, n, images, targets = r.start, len(r.tokens), r.images, r.prompt_targets
            if flat:
                for i in range(n):
                    p = start + i
                    last = r.samples and i == n - 1
                    image = images.rows(p, 1) if images else None
                    at = images.rope_positions(p, 1) if images else None
                    add(
                        Row(r.tokens[i : i + 1], p, r.block_ids, image=image, positions=at),
                        r,
                        [0] if last else [],
                    )
                    if i < len(targets):
                        points.prompt.append((len(rows) - 1, 0, r, p + 1, targets[i]))
            else:
                add(
                    Row(
                        r.tokens,
                        start,
                        r.block_ids,
                        r.state_slot,
                        images.rows(start, n) if images else None,
                        images.rope_positions(start, n) if images else None,
                    ),
                    r,
                    [None] if r.samples else [],
                )
                points.prompt.extend(
                    (len(rows) - 1, i, r, start + i + 1, t) for i, t in enumerate(targets)
                )
        return rows, points


def _runs(keys: list[RequestKey]) -> tuple[list[RequestKey], list[int]]:
    """Consecutive repeats collapsed: the requests in order, and how many points each."""
    unique: list[RequestKey] = []
    counts: list[int] = []
    for key in keys:
        if unique and unique[-1] == key:
            counts[-1] += 1
        else:
            unique.append(key)
            counts.append(1)
    return unique, counts
