"""The forward passes before an Engine serves (`Engine.create` runs them after assembly): the
model checked over the paged KV (`check_model`: each layer's mode decided; `verify_greedy`: an
architecture the tests do not cover compared with mlx-lm), then warmed up (`warm_up`). A
tensor-parallel follower mirrors exactly these forwards, in this order: the shape probe, the model
check, the warm-up. They take the parts they need and return what they decide; the requests they
run go through a `Serving` (an engine's request side), never the engine's own fields."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Protocol

import mlx.nn as nn

from shared.protocol import KVGroupReport
from shared.sampling import SamplingParams
from worker.kv.memory import layers_bytes_per_block
from worker.runner.layer_groups import LayerKind, group_layers
from worker.runner.model_support import (
    COVERED_ARCHITECTURES,
    ModelShape,
    UnsupportedModel,
    decide_modes,
    model_type,
    reference_greedy,
    verification_prompt,
)
from worker.runner.plan import Forward, ForwardRequest, RequestKey, StepKind

if TYPE_CHECKING:
    from shared.protocol import TokenDelta
    from worker.kv.block_pool import BlockPool
    from worker.runner.model_runner import LayerProbe
    from worker.state.pool import StatePool

log = logging.getLogger(__name__)


class Serving(Protocol):
    """What the checks drive to run their internal requests: an engine's request side
    (`Engine` is one). Their cache entries and KV events are forgotten afterwards."""

    def add_request(
        self, request_id: str, token_ids: list[int], sampling: SamplingParams
    ) -> None: ...

    def has_work(self) -> bool: ...

    def step(self) -> list[TokenDelta]: ...

    def forget_cache(self) -> None:
        """Drop the prefix cache and the KV events not sent yet."""


class Probed(Protocol):
    """What the model check asks of a runner (a `ModelRunner`, a tensor-parallel leader's):
    the probe's forward with every layer gathered, then the modes it decided."""

    def probe(self, plan: Forward) -> LayerProbe: ...

    def settle_modes(self, gathered: list[bool]) -> None: ...


def kv_groups(pool: BlockPool, kinds: list[LayerKind], gathered: list[bool]):
    """The pool's layer groups as the worker reports them (`/v1/cluster`, `/metrics`)."""
    quant = {"kv_bits": pool.kv_bits, "kv_group_size": pool.kv_group_size}
    return tuple(
        KVGroupReport(
            group.kind.describe(),
            len(group.layers),
            layers_bytes_per_block(
                1, [pool.layer_shapes[i] for i in group.layers], pool.dtype, **quant
            ),
            sum(not gathered[i] for i in group.layers),
        )
        for group in group_layers(kinds)
    )


def check_model(
    runner: Probed,
    model: nn.Module,
    shape: ModelShape,
    scratch_block: int,
    states: StatePool | None,
) -> list[bool]:
    """Refuse a model the paged KV would serve wrongly, and decide each layer's mode (see
    `worker.runner.model_support`): a one-token forward with every layer gathered shows
    which layers the paged attention plan can serve. Settles the modes on `runner` and
    returns them (True: gathered). `states`: a hybrid model's state pool, for the probes'
    slots."""
    # two rows at different positions: a model that reads one position for the whole batch
    # (`cache.offset` as a number) fails here, not on its first batch
    probes = []
    for position in (0, 1):  # the last token of a one- and of a two-token prompt
        slot = states.allocate() if states is not None else -1
        key = RequestKey("__probe__", position)
        sampling = SamplingParams(max_tokens=1)
        probes.append(ForwardRequest(key, [0], position, [scratch_block], sampling, 0, slot))
    plan = Forward(StepKind.PREFILL, [], probes)
    kinds = shape.kinds()
    name = model_type(model)
    try:
        probed = runner.probe(plan)
    except Exception as exc:  # noqa: BLE001 - whatever breaks the probe is a refusal
        raise UnsupportedModel(
            f"model type {name!r} failed a one-token forward over the paged KV "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    for probe in (p for p in probes if p.state_slot >= 0):
        states.free(probe.state_slot)
    gathered = decide_modes(model, kinds, probed.caches, probed.uncached_attention)
    runner.settle_modes(gathered)
    log.info(
        "model type %r: %s; %d of %d layers paged, %d gathered",
        name,
        ", ".join(f"{len(g.layers)} x {g.kind.describe()}" for g in group_layers(kinds)),
        gathered.count(False),
        len(gathered),
        gathered.count(True),
    )
    return gathered


def verify_greedy(engine: Serving, model: nn.Module, vocab_size: int, block_size: int) -> None:
    """For an architecture the tests do not cover (else nothing): two prompts of different
    lengths decoded together, greedy, against plain mlx-lm alone; refuse the model unless the
    tokens match (a model that derives positions from the batch's K/V length passes alone,
    not batched)."""
    name = model_type(model)
    if name in COVERED_ARCHITECTURES:
        return
    prompts = [
        verification_prompt(vocab_size, block_size + 5),
        verification_prompt(vocab_size, 3, salt=11),
    ]
    expected = [reference_greedy(model, p, 6) for p in prompts]
    got = run_together(engine, prompts, 6)
    if got != expected:
        raise UnsupportedModel(
            f"model type {name!r} is not among the tested architectures "
            f"({', '.join(sorted(COVERED_ARCHITECTURES))}) and its greedy output over the "
            f"paged KV differs from mlx-lm's ({got} vs {expected})"
        )
    log.info("model type %r: paged greedy output matches mlx-lm; serving it", name)


def warm_up(engine: Serving, block_size: int) -> None:
    """Run a short request through prefill and decode, then forget it, so the first real
    request pays no one-time costs (allocations, graph construction). The caller resets its
    step statistics afterwards."""
    start = time.perf_counter()
    run_alone(engine, [0] * (block_size + 3), 3)
    log.info("warm-up took %.2fs", time.perf_counter() - start)


def run_alone(engine: Serving, prompt: list[int], max_tokens: int) -> list[int]:
    """Greedy tokens of one internal request, run to the end; forgets its cache entries."""
    return run_together(engine, [prompt], max_tokens)[0]


def run_together(engine: Serving, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Greedy tokens of internal requests decoded together, run to the end; forgets their
    cache entries."""
    ids = [f"__check{i}__" for i in range(len(prompts))]
    for rid, prompt in zip(ids, prompts, strict=True):
        engine.add_request(rid, prompt, SamplingParams(max_tokens=max_tokens))
    tokens: dict[str, list[int]] = {rid: [] for rid in ids}
    while engine.has_work():
        for delta in engine.step():
            if delta.error:
                raise UnsupportedModel(f"the load-time check failed: {delta.error}")
            tokens[delta.request_id] += delta.token_ids
    engine.forget_cache()
    return [tokens[rid] for rid in ids]
