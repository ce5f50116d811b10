"""What the runner is handed for one forward: plain data, built by the engine from its step
plan (`StepPlan`, which holds its sequences). Per request: its id and choice, the token ids to
feed, where they go (first position, block table, state slot) and how it samples. The runner
imports nothing of the engine; it keeps its own per-request state (rng keys) by `RequestKey`,
and drops it for the requests a `Forward` says are over."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from shared.sampling import SamplingParams
    from worker.runner.logits_processors import LogitsState
    from worker.vision.prompt_images import PromptImages


class StepKind(enum.Enum):
    """How one step's work goes through the model."""

    DECODE = "decode"  # one token per decoding sequence, one forward (pipelined when steady)
    MIXED = "mixed"  # decode rows + prefill chunks as one-token rows ("folded"), one forward
    SEPARATE = "separate"  # a decode forward (with the folded chunks), then prefill forwards
    PREFILL = "prefill"  # prefill forwards only, rows right-padded to their forward's longest
    IDLE = "idle"  # nothing to run


class RequestKey(NamedTuple):
    """Which sequence: a request's id and its choice (n > 1: choice i of the request)."""

    request_id: str
    choice: int


class ForwardRequest(NamedTuple):
    """One request's share of a forward."""

    key: RequestKey
    # fed: a decode's last token, then its drafts (each a one-token row that samples, so the
    # drafts are verified); a prefill's chunk. Empty for a decode whose input is still on
    # the device (a pipelined step: the runner is handed the tokens)
    tokens: list[int]
    start: int  # the position of tokens[0]: every token before it has its K/V in the pool
    block_ids: list[int]
    sampling: SamplingParams
    seed: int  # of its rng key (choice i of a request samples with seed + i)
    state_slot: int = -1  # its recurrent layers' state slot (hybrid models: `worker.state`)
    samples: bool = True  # a prefill chunk that ends the prompt samples the next token
    # prompt logprobs asked for: the prompt tokens after positions start, start + 1, ...,
    # whose logprob the logits there score
    prompt_targets: tuple[int, ...] | list[int] = ()
    logits_state: LogitsState | None = None  # bias, penalties, grammar (mutated by sampling)
    images: PromptImages | None = None  # its prompt's images (vision models)


class Forward(NamedTuple):
    """One forward: `decode` rows (MIXED: and `prefill` chunks as one-token rows) or padded
    `prefill` rows (PREFILL). `finished`: requests over since the last forward; the runner
    forgets their state before it runs this one."""

    kind: StepKind
    decode: list[ForwardRequest]
    prefill: list[ForwardRequest]
    finished: tuple[RequestKey, ...] | list[RequestKey] = ()
    # blocks copied on write since the last forward, (source, copy): made on the pool the
    # engine's KV manager keeps; a tensor-parallel follower makes them on its shard first
    copies: tuple[tuple[int, int], ...] | list[tuple[int, int]] = ()
