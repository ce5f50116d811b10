"""One request's state inside the engine: its tokens, its blocks, how far its KV is computed."""

from __future__ import annotations

import enum
import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from worker.runner.plan import RequestKey

if TYPE_CHECKING:
    from shared.protocol import CachePin
    from shared.sampling import SamplingParams
    from worker.engine.speculative import DraftState
    from worker.runner.logits_processors import LogitsState
    from worker.vision.prompt_images import PromptImages


def enqueue(waiting: deque[Sequence], seq: Sequence, first: bool = False) -> None:
    """Mutates: put `seq` in the waiting queue behind the work of its priority or higher
    (in front of lower-priority work: batch lines never delay interactive requests), at the
    front of its own class when `first` (a preempted sequence resumes before its peers)."""
    if not waiting or waiting[-1].priority <= seq.priority and not first:
        waiting.append(seq)  # the common case: one class, or lowest priority at the end
        return
    ahead = (s.priority < seq.priority if first else s.priority <= seq.priority for s in waiting)
    waiting.insert(sum(1 for _ in itertools.takewhile(bool, ahead)), seq)


def preemption_victim(running: list[Sequence]) -> Sequence:
    """Whom to preempt when blocks run out: the lowest class (batch before interactive),
    newest first within it (it has the least work to lose)."""
    return max(running, key=lambda s: (s.priority, s.arrival))


class Status(enum.Enum):
    WAITING = "waiting"  # queued; holds no blocks
    RUNNING = "running"  # admitted: holds blocks, prefilling or decoding
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    request_id: str
    prompt_len: int
    tokens: list[int]  # prompt + generated so far
    sampling: SamplingParams
    arrival: int  # admission order, for preempting the newest first
    status: Status = Status.WAITING
    block_ids: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens whose K/V are in the pool
    num_in_flight: int = 0  # of those, tokens a launched step still writes (unread, may fail)
    num_cached: int = 0  # prompt tokens served from the prefix cache (first admission)
    inserted_tokens: int = 0  # tokens already handed to the radix cache
    state_slot: int = -1  # its recurrent layers' state slot (hybrid models: worker.state)
    logprobs: list[float] = field(default_factory=list)
    num_preemptions: int = 0
    seed: int = 0  # of its rng key (the runner's); choice i of a request samples with seed + i
    choice: int = 0  # which of its request's n choices this sequence is
    forks: int = 0  # choices still to fork off this one once its prompt is computed
    logits_state: LogitsState | None = None  # bias, penalties, grammar (when asked for)
    draft: list[int] = field(default_factory=list)  # this step's speculative tokens
    drafting: DraftState | None = None  # set when speculative decoding may draft for it
    # with sampling.prompt_logprobs: (logprob, rank, top) of prompt tokens 1.. as computed
    prompt_logprobs: list[tuple] = field(default_factory=list)
    prompt_logprobs_sent: bool = False  # handed out (with the first delta)
    images: PromptImages | None = None  # its prompt's images (vision models)
    priority: int = 0  # Generate.priority: 0 interactive; higher waits and is preempted first
    # Generate.pins not taken yet: each is taken once its prefix is in the cache (scheduler)
    pins: tuple[CachePin, ...] = ()

    def fork(self, choice: int) -> Sequence:
        """A copy that shares the prompt computed so far (the caller shares its blocks)."""
        return Sequence(
            request_id=self.request_id,
            prompt_len=self.prompt_len,
            tokens=list(self.tokens),
            sampling=self.sampling,
            arrival=self.arrival,
            status=self.status,
            block_ids=list(self.block_ids),
            num_computed=self.num_computed,
            num_cached=self.num_cached,
            inserted_tokens=self.inserted_tokens,
            seed=self.seed,
            choice=choice,
            logits_state=self.logits_state.fork() if self.logits_state is not None else None,
            prompt_logprobs=list(self.prompt_logprobs),
            images=self.images,  # shared: M-RoPE positions for its last prompt token and on
            priority=self.priority,
        )

    def advance_grammar(self, token: int) -> bool:
        """Mutates: the grammar (if any) consumes the sampled `token`; True when it is then
        complete (nothing more may follow), which ends the sequence with "stop"."""
        state = self.logits_state
        return state is not None and state.grammar is not None and state.grammar.advance(token)

    @property
    def key(self) -> RequestKey:
        """Which sequence it is, to the runner: its request's id and its choice."""
        return RequestKey(self.request_id, self.choice)

    @property
    def scores_prompt(self) -> bool:
        """Whether its prompt's logprobs are still to be computed (they were asked for)."""
        return self.sampling.prompt_logprobs is not None and not self.prompt_logprobs_sent

    @property
    def num_output(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def num_uncomputed(self) -> int:
        return len(self.tokens) - self.num_computed

    @property
    def yields(self) -> bool:
        """A batch line's: it pauses while an interactive prompt prefills (Scheduler)."""
        return self.priority > 0

    @property
    def is_prefilling(self) -> bool:
        return self.num_uncomputed > 1

    @property
    def prefill_left(self) -> int:
        """Prompt tokens to compute before the next step samples (with forks pending, the
        last one is computed by each choice on its own, after the fork)."""
        return self.num_uncomputed - (1 if self.forks else 0)

    @property
    def output_tokens(self) -> list[int]:
        return self.tokens[self.prompt_len :]
