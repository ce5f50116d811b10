"""Continuous batching over the paged KV: who runs this step, and with which blocks.

Every step: each decoding sequence gets a slot for its next token (a new block when it
crosses a boundary); what is left of the step's token budget goes to prefill chunks: first
sequences already mid-prompt, then newly admitted ones (FIFO), each admitted with its longest
cached prefix (the hit every cache kind agrees on), and only when its whole prompt fits beside
what the running sequences still need (no overcommit). When blocks run out, the prefix cache
gives back its least recently used unreferenced blocks, then its oldest pins (prefixes requests
asked to keep, worker/kv/pins.py); then the newest running sequence is preempted and requeued
(its computed blocks stay cached). Every block comes from, and goes back to, the KV manager
(`self.kv`, worker/engine/caches/manager.py): the scheduler never touches the pool or the tree.

Speculative decoding (worker/engine/speculative.py proposes a sequence's drafts): which drafts
a step verifies is chosen per row, where it pays (`choose_drafts`). A draft's rows gather keys
(priced as the fold rule prices folded rows, `ForwardCosts` over `gathered_keys`, the shared
prefix once per group) and go through the weights' matmuls; what it buys is its expected
accepted tokens (the row's acceptance estimate, an EWMA of accepted/drafted, times the draft's
length), each a decode tick's cost per row saved. So a small batch drafts freely, a large one
only rows whose drafts are usually accepted, and a step where no row drafts stays pipelined."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from worker.attention.shared_prefix import gathered_keys
from worker.engine.admission import shares_pending_prefill
from worker.engine.batch_yield import BatchHold, yield_to_interactive
from worker.engine.sequence import Sequence, Status, enqueue, preemption_victim
from worker.engine.step_kind import (
    REFERENCE_COSTS,
    ForwardCosts,
    PrefillChunk,
    StepPlan,
    plan_step,
)
from worker.runner.plan import RequestKey, StepKind

if TYPE_CHECKING:
    from worker.config import EngineConfig
    from worker.engine.caches import KVManager


class Scheduler:
    """The only owner of sequence lifecycle: admission, preemption, advancing and finishing
    (the blocks, and the prefix a sequence starts from, are the KV manager's). The engine
    asks it for plans and reports what the model produced."""

    def __init__(
        self,
        kv: KVManager,
        config: EngineConfig,
        max_context: int,
        costs: ForwardCosts = REFERENCE_COSTS,
        clock: Callable[[], float] = time.monotonic,
        pad_states: bool = True,
    ):
        """`kv`: the KV manager (worker/engine/caches/manager.py), the only one touching the
        block pool, the prefix cache and every cache kind. `costs`: the model's forward prices
        (the fold rule's, `forward_costs`). `clock`: for the batch hold. `pad_states`: whether
        a hybrid model's prefill rows may be right-padded (its recurrent layers honour it)."""
        self.kv, self.config, self.costs = kv, config, costs
        self.states = kv.states  # hybrid models' recurrent state slots (whether any)
        self.pad_states = pad_states
        self.max_context = max_context
        self.block_size = kv.block_size
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        # sequences ended since the runner last heard (`take_finished`): it drops their state
        self.finished: list[RequestKey] = []
        self.batch_hold = BatchHold(config.batch_hold_s, clock)  # worker/engine/batch_yield.py

    # ---- queue -------------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        enqueue(self.waiting, seq)

    def remove(self, seq: Sequence) -> None:
        """Take `seq` out of the queues and give back its blocks (abort or finish)."""
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
            self.kv.free(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = Status.FINISHED
        self.finished.append(seq.key)
        if not seq.yields and not self.interactive():
            self.batch_hold.ended()

    def interactive(self) -> bool:
        """Whether interactive (not batch) work is queued or running."""
        return any(not s.yields for s in (*self.waiting, *self.running))

    def hold_s(self) -> float:
        """Seconds to run nothing: only batch work is here, and the last interactive request
        ended within the hold (its client's next one is likely on its way)."""
        return self.batch_hold.hold_left(self.interactive()) if self.has_work() else 0.0

    def take_finished(self) -> list[RequestKey]:
        """Mutates: the sequences ended since the last call (for the runner's next forward)."""
        finished, self.finished = self.finished, []
        return finished

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def sequences_of(self, request_id: str) -> list[Sequence]:
        """Every queued or running sequence of a request (its choices, with n > 1)."""
        return [s for s in (*self.waiting, *self.running) if s.request_id == request_id]

    # ---- the step plan -----------------------------------------------------------------

    def schedule(self) -> StepPlan:
        preempted: list[Sequence] = []
        if self.hold_s() > 0:
            return StepPlan(StepKind.IDLE, [], [], [])
        self._fork_ready()
        decode = self._schedule_decode(preempted)
        self._plan_drafts(decode)
        budget = self.config.step_token_budget - sum(1 + len(s.draft) for s in decode)
        # batch lines prefill one chunk's worth a step, all of them together: an interactive
        # request that arrives while a step runs waits for a short one, not for eight prompts
        batch = self.config.prefill_chunk
        prefill = self._continue_prefills(budget, preempted, batch)
        budget -= sum(c.num_tokens for c in prefill)
        batch -= sum(c.num_tokens for c in prefill if c.seq.yields)
        if not preempted:
            # (after a preemption the pool is full anyway; and admitting now could take back
            # a sequence preempted above, already in this plan: planned twice, its rows would
            # run past its new blocks)
            interactive = any(not c.seq.yields for c in prefill)
            prefill += self._admit(budget, interactive, batch)
        # a later reservation may have preempted a sequence planned earlier in this step
        decode = [s for s in decode if s.status is Status.RUNNING]
        prefill = [c for c in prefill if c.seq.status is Status.RUNNING]
        decode, prefill = yield_to_interactive(decode, prefill)
        rows = self.pad_states if self.states.active else None  # (no folding: step_kind)
        return plan_step(decode, prefill, preempted, self.costs, self.block_size, rows)

    # ---- pipelined decode --------------------------------------------------------------

    def can_continue_decode(self, seqs: list[Sequence]) -> bool:
        """Whether the next step can be `seqs` (the batch whose step is in flight, its tokens
        not yet read) decoding once more, safely: nothing to admit (a waiting request that
        could not be admitted now keeps the batch pipelined) or prefill, none that the
        in-flight token could end by length, and blocks for every next slot without
        preempting. Does not mutate."""
        if self._can_admit() or len(self.running) != len(seqs):
            return False
        if not self.batch_hold.pipelines(self.interactive()):
            return False  # batch rows only, interactive work recent: no step queued ahead
        for seq in seqs:
            if seq.status is not Status.RUNNING or seq.num_uncomputed != 0:
                return False
            if seq.sampling.needs_host_step:  # its grammar needs the in-flight token first
                return False
            if (
                seq.num_output + 1 >= seq.sampling.max_tokens
                or len(seq.tokens) + 2 >= self.max_context
            ):
                return False
        if self._would_draft(seqs):
            return False  # verifying drafts needs the tokens on the host: a planned step
        return self.kv.fits(sum(self.kv.blocks_needed(s, s.num_computed + 1) for s in seqs))

    def continue_decode(self, seqs: list[Sequence]) -> StepPlan:
        """Mutates: the DECODE plan `can_continue_decode(seqs)` allowed, blocks grown."""
        if not self.kv.make_room(sum(self.kv.blocks_needed(s, s.num_computed + 1) for s in seqs)):
            raise RuntimeError("continue_decode without can_continue_decode")
        for seq in seqs:
            self.kv.grow(seq, seq.num_computed + 1)
            seq.draft = []
            if seq.drafting is not None:
                seq.drafting.tick()
        return StepPlan(StepKind.DECODE, list(seqs), [], [])

    # ---- results -----------------------------------------------------------------------

    def computed(self, seq: Sequence, num_tokens: int, in_flight: bool = False) -> None:
        """Mutates: `num_tokens` more of `seq`'s tokens have their K/V in the pool (or will:
        `in_flight`, the step writing them is not read yet); a finished prompt enters the cache."""
        seq.num_computed += num_tokens
        seq.num_in_flight += num_tokens if in_flight else 0
        self.kv.computed(seq)
        self.kv.cache_prompt(seq)  # a finished prompt: waiting requests may share it

    def append_token(self, seq: Sequence, token: int, logprob: float | None) -> str | None:
        """Mutates: `seq` sampled `token`; its finish reason ("stop", "length") if that ends
        it (then it is removed and its blocks given back), else None."""
        seq.tokens.append(token)
        if seq.sampling.logprobs and logprob is not None:
            seq.logprobs.append(logprob)
        grammar_done = seq.advance_grammar(token)
        if token in seq.sampling.stop_token_ids or grammar_done:
            reason = "stop"
        elif seq.num_output >= seq.sampling.max_tokens or len(seq.tokens) >= self.max_context:
            reason = "length"
        else:
            return None
        self.remove(seq)
        return reason

    def _schedule_decode(self, preempted: list[Sequence]) -> list[Sequence]:
        decode = []
        for seq in sorted(
            (s for s in self.running if not s.is_prefilling and not s.forks),
            key=lambda s: s.arrival,
        ):
            if seq.status is not Status.RUNNING:
                continue  # preempted earlier in this loop
            if self._reserve(seq, seq.num_computed + 1, preempted):
                decode.append(seq)
        return decode

    def _continue_prefills(
        self, budget: int, preempted: list[Sequence], batch: int
    ) -> list[PrefillChunk]:
        """Mutates: the next chunk of each running prompt, oldest first, within `budget`
        tokens, and within `batch` tokens for batch lines' prompts together."""
        chunks = []
        for seq in sorted((s for s in self.running if s.is_prefilling), key=lambda s: s.arrival):
            n = min(self.config.prefill_chunk, seq.prefill_left, budget)
            n = min(n, batch) if seq.yields else n
            n = self.kv.chunk(seq, n)
            if seq.status is not Status.RUNNING or n <= 0:
                continue
            if self._reserve(seq, seq.num_computed + n, preempted):
                chunks.append(PrefillChunk(seq, n))
                budget -= n
                batch -= n if seq.yields else 0
        return chunks

    def _admit(self, budget: int, interactive: bool, batch: int) -> list[PrefillChunk]:
        """Mutates: admit waiting sequences, in queue order, while the step has budget and
        the pool room; a batch line only within `batch` tokens of batch prompts, and none
        once an interactive prompt prefills in this step (`interactive`: one already does),
        as it would pause at once (yield_to_interactive)."""
        chunks, deferred = [], []
        while self.waiting and budget > 0 and len(self.running) < self.config.max_running:
            if self.waiting[0].yields and (interactive or batch <= 0):
                break
            if not self.kv.room(self.waiting[0], self.running):
                break
            seq = self.waiting.popleft()
            # the last token is always computed, for its logits; a prompt to score is all
            use_cache = self.kv.uses_cache(seq)
            prompt = seq.tokens[:-1] if use_cache else []
            cached = self.kv.prefix_length(prompt)
            if use_cache and shares_pending_prefill(seq, cached + self.block_size, self.running):
                deferred.append(seq)  # wait for that prefill, then hit its blocks
                continue
            prefix = self.kv.hold(prompt)
            done = prefix.num_tokens
            left = len(seq.tokens) - done - (1 if seq.forks else 0)
            n = min(self.config.prefill_chunk, left, budget, batch if seq.yields else budget)
            self.kv.plan(seq, prefix)
            n = self.kv.chunk(seq, n, done)
            n = n if self.running else self.kv.chunk_that_fits(prefix, n)
            if not self.kv.admit(seq, prefix, done + n, self.running):
                self.waiting.appendleft(seq)
                break
            self._start(seq)
            if n > 0:  # 0: all but the last token cached, and forks pending
                chunks.append(PrefillChunk(seq, n))
                interactive = interactive or not seq.yields
            budget -= n
            batch -= n if seq.yields else 0
        self.waiting.extendleft(reversed(deferred))
        return chunks

    def _can_admit(self) -> bool:
        """Whether the first waiting request could be admitted now (top-up: it then joins
        the next step, folded into the decode forward where that pays). Does not mutate."""
        if not self.waiting or len(self.running) >= self.config.max_running:
            return False
        seq = self.waiting[0]
        cached = self.kv.prefix_length(seq.tokens[:-1]) // self.block_size
        return self.kv.prompt_fits(seq, cached, self.running)

    def _start(self, seq: Sequence) -> None:
        """`seq`, admitted on its prefix (`KVManager.admit`), runs."""
        if seq.num_preemptions == 0:
            seq.num_cached = seq.num_computed
        seq.status = Status.RUNNING
        self.running.append(seq)

    # ---- speculative decoding: drafts verified in the decode forward ----------------------

    def _would_draft(self, seqs: list[Sequence]) -> bool:
        """Whether any of the decoding `seqs` would verify a draft next step."""
        args = (self.config, self.max_context, self.costs, self.block_size)
        return bool(choose_drafts(seqs, *args, first_only=True))

    def _plan_drafts(self, decode: list[Sequence]) -> None:
        """Mutates: this step's drafts of the decoding sequences, with blocks for them (only
        from free or evictable blocks: a draft never preempts anyone)."""
        for seq in decode:
            seq.draft = []
            if seq.drafting is not None:
                seq.drafting.tick()
        chosen = choose_drafts(decode, self.config, self.max_context, self.costs, self.block_size)
        for seq in decode:
            draft = chosen.get(id(seq))
            end = seq.num_computed + 1 + len(draft or ())
            if draft and self.kv.allocate_slots(seq, end):
                seq.draft = draft

    # ---- n > 1: choices forked after one prefill ------------------------------------------

    def _fork_ready(self) -> None:
        """Mutates: fork every sequence whose prompt is computed but for its last token."""
        for seq in [s for s in self.running if s.forks and s.num_uncomputed == 1]:
            self._fork(seq)

    def _fork(self, parent: Sequence) -> None:
        """Give `parent`'s pending choices their own sequences: they share its full blocks by
        reference count, and each kind gives them what a fork needs (a partial last block,
        which each choice writes its next token into, is copied). Waits (no fork, no decode)
        while there is no room."""
        if not self.kv.make_room(self.kv.fork_blocks(parent)):
            return
        for choice in range(1, parent.forks + 1):
            child = parent.fork(choice)
            self.kv.fork(parent, child)
            self.running.append(child)
        parent.forks = 0

    # ---- blocks ------------------------------------------------------------------------

    def _reserve(self, seq: Sequence, num_tokens: int, preempted: list[Sequence]) -> bool:
        """Give `seq` blocks for `num_tokens`, evicting, then preempting as needed."""
        while not self.kv.allocate_slots(seq, num_tokens):
            victim = preemption_victim(self.running)
            self.preempt(victim)
            preempted.append(victim)
            if victim is seq:
                return False
        return True

    def preempt(self, seq: Sequence) -> None:
        """Free `seq`'s blocks (computed ones stay in the prefix cache) and requeue it first."""
        self.running.remove(seq)
        self.kv.free(seq)
        seq.status = Status.WAITING
        seq.num_computed = 0
        seq.num_preemptions += 1
        enqueue(self.waiting, seq, first=True)

    def drop(self, seq: Sequence) -> None:
        """Like remove, but nothing of `seq` enters the prefix cache (its KV is suspect)."""
        self.kv.distrust(seq)
        self.remove(seq)


def draft_budget(seq: Sequence, config: EngineConfig, max_context: int) -> int:
    """Most draft tokens `seq` may verify this step (its token and context limits)."""
    left = min(
        seq.sampling.max_tokens - seq.num_output - 1,
        max_context - len(seq.tokens) - 2,
    )
    return max(0, min(config.spec_tokens, left))


def choose_drafts(
    seqs: list[Sequence],
    config: EngineConfig,
    max_context: int,
    costs: ForwardCosts,
    block_size: int,
    first_only: bool = False,
) -> dict[int, list[int]]:
    """The drafts (by `id(seq)`) worth verifying next step among the decoding `seqs`: those
    whose expected accepted tokens, each a decode tick's cost per row, outweigh the keys their
    one-token rows add to the forward's gather and their token slots. The likeliest first
    (`first_only`: stop at the first that pays). Does not mutate (but for the n-gram indexes
    catching up with the tokens). Host ints only: ~12 ms at 64 rows that all draft."""
    if config.speculative == "off" or not seqs:
        return {}
    proposals = []
    for seq in seqs:
        if seq.drafting is not None:
            draft = seq.drafting.propose(seq.tokens, draft_budget(seq, config, max_context))
            if draft:
                proposals.append((seq, draft))
    if not proposals:
        return {}
    tables = [_table(s, s.num_computed + 1, block_size) for s in seqs]
    lengths = [s.num_computed + 1 for s in seqs]
    keys = gathered_keys(tables, lengths, block_size)
    tick = costs.weight_pass_s + keys * costs.key_s + len(seqs) * costs.token_s
    per_row = tick / len(seqs)  # what a decode tick costs each of its rows
    chosen: dict[int, list[int]] = {}
    for seq, draft in sorted(proposals, key=lambda p: -p[0].drafting.acceptance):
        start, k = seq.num_computed + 1, len(draft)
        table = _table(seq, start + k, block_size)
        with_draft = gathered_keys(
            tables + [table] * k, lengths + list(range(start + 1, start + k + 1)), block_size
        )
        cost = (with_draft - keys) * costs.key_s + k * costs.token_s
        if seq.drafting.acceptance * k * per_row > cost:
            chosen[id(seq)] = draft
            tables += [table] * k
            lengths += range(start + 1, start + k + 1)
            keys = with_draft
            if first_only:
                break
    return chosen


def _table(seq: Sequence, num_tokens: int, block_size: int) -> list[int]:
    """`seq`'s block ids for `num_tokens` tokens: blocks it does not have yet stand in as ids
    no other row has (a new block is never shared)."""
    missing = -(-num_tokens // block_size) - len(seq.block_ids)
    return seq.block_ids + [-1 - id(seq) * 64 - i for i in range(max(0, missing))]
