"""The fold rule's decisions (`plan_step`) on the shapes of the benchmark loads, priced as the
default model on the reference machine: a chat admission after a cached system prompt folds
into the decode forward; a cold 2k prompt's chunk does not; chunks left unfolded are packed
into padded forwards by length."""

from __future__ import annotations

import itertools

from shared.sampling import SamplingParams
from worker.engine.sequence import Sequence, Status
from worker.engine.step_kind import REFERENCE_COSTS, PrefillChunk, pack, plan_step
from worker.runner.plan import StepKind

BLOCK = 32
SYSTEM = 1000  # the multi_tenant workload's system prompts (~1000 tokens)
SUFFIX = 45  # its question and the chat template's tail
_ids = itertools.count(1)


def blocks(n: int) -> list[int]:
    return [next(_ids) for _ in range(n)]


def seq(prefix_blocks: list[int], length: int, computed: int) -> Sequence:
    """A running sequence of `length` tokens on `prefix_blocks` plus blocks of its own."""
    own = -(-(length + 1) // BLOCK) - len(prefix_blocks)
    s = Sequence("r", length, [0] * length, SamplingParams(max_tokens=32), arrival=0)
    s.status, s.block_ids, s.num_computed = Status.RUNNING, prefix_blocks + blocks(own), computed
    return s


def chat_batch() -> tuple[list[list[int]], list[Sequence]]:
    """4 tenants' cached system prompts (whole blocks) and 10 decode rows over them, each a
    question in and 0-32 tokens out."""
    tenants = [blocks(SYSTEM // BLOCK) for _ in range(4)]
    decode = []
    for i in range(10):
        length = SYSTEM + SUFFIX + (i * 7) % 33
        decode.append(seq(tenants[i % 4], length, length))
    return tenants, decode


def admission(tenant: list[int]) -> PrefillChunk:
    """A chat request admitted on its tenant's cached system prompt: its suffix to compute."""
    cached = len(tenant) * BLOCK
    s = seq(tenant, SYSTEM + SUFFIX, cached)
    return PrefillChunk(s, SYSTEM + SUFFIX - cached)


def cold_chunk(prompt_len: int = 2048, chunk: int = 256) -> PrefillChunk:
    return PrefillChunk(seq([], prompt_len, 0), chunk)


def test_a_chat_admission_after_a_cached_prefix_folds():
    tenants, decode = chat_batch()
    plan = plan_step(decode, [admission(tenants[1])], [], REFERENCE_COSTS, BLOCK)
    assert plan.kind is StepKind.MIXED
    assert [p.kind for p in plan.split()] == [StepKind.MIXED]  # one forward, one weight pass


def test_the_old_rule_would_not_have_folded_it():
    chunk = admission(chat_batch()[0][0])
    assert chunk.num_tokens * (chunk.seq.num_computed + chunk.num_tokens) > 16384


def test_a_cold_2k_prompt_does_not_fold():
    _, decode = chat_batch()
    plan = plan_step(decode, [cold_chunk()], [], REFERENCE_COSTS, BLOCK)
    assert plan.kind is StepKind.SEPARATE and plan.folded == 0
    assert [p.kind for p in plan.split()] == [StepKind.DECODE, StepKind.PREFILL]


def test_beside_a_cold_chunk_the_chat_admissions_are_not_padded_to_it():
    """Two admissions fold for ~9k keys, more than a forward of their own costs; the cold
    chunk's forward holds it alone either way."""
    tenants, decode = chat_batch()
    chats = [admission(tenants[0]), admission(tenants[2])]
    cold = cold_chunk()
    plan = plan_step(decode, [cold, *chats], [], REFERENCE_COSTS, BLOCK)
    assert plan.kind is StepKind.SEPARATE
    parts = plan.split()
    assert parts[0].kind in (StepKind.DECODE, StepKind.MIXED) and parts[0].decode == decode
    assert [cold] in [p.prefill for p in parts[1:]]
    assert sum(len(p.prefill) for p in parts) == 3
    for part in parts[1:]:
        assert len({c.num_tokens for c in part.prefill}) == 1


def test_a_cold_prompt_continued_mid_way_does_not_fold_either():
    _, decode = chat_batch()
    s = seq([], 2048, 768)
    plan = plan_step(decode, [PrefillChunk(s, 256)], [], REFERENCE_COSTS, BLOCK)
    assert plan.kind is StepKind.SEPARATE and plan.folded == 0


def test_decode_only_and_idle():
    _, decode = chat_batch()
    assert plan_step(decode, [], [], REFERENCE_COSTS, BLOCK).kind is StepKind.DECODE
    assert plan_step([], [], [], REFERENCE_COSTS, BLOCK).kind is StepKind.IDLE


def test_prefill_chunks_of_unequal_lengths_are_not_padded_to_the_longest():
    """Without a decode batch: a 256-token cold chunk and two short suffixes make two
    forwards (the short ones together), not one padded to 256 (422 wasted slots)."""
    tenants, _ = chat_batch()
    cold, a, b = cold_chunk(), admission(tenants[0]), admission(tenants[1])
    plan = plan_step([], [a, cold, b], [], REFERENCE_COSTS, BLOCK)
    assert plan.kind is StepKind.PREFILL
    parts = plan.split()
    assert len(parts) == 2
    assert sorted(len(p.prefill) for p in parts) == [1, 2]
    for part in parts:  # each forward's rows are of one length: no padding anywhere
        assert len({c.num_tokens for c in part.prefill}) == 1


def test_pack_joins_chunks_whose_padding_costs_less_than_a_weight_pass():
    near = [cold_chunk(chunk=n) for n in (256, 240, 230)]
    assert [len(g) for g in pack(near, REFERENCE_COSTS)] == [3]
    far = [cold_chunk(chunk=n) for n in (256, 45, 40)]
    assert [[c.num_tokens for c in g] for g in pack(far, REFERENCE_COSTS)] == [[256], [45, 40]]


def test_split_keeps_the_old_shape_of_a_separate_plan_without_groups():
    _, decode = chat_batch()
    chunks = [cold_chunk(), cold_chunk(chunk=100)]
    parts = plan_step(decode, chunks, [], REFERENCE_COSTS, BLOCK)._replace(groups=()).split()
    assert [(p.kind, len(p.prefill)) for p in parts] == [
        (StepKind.DECODE, 0),
        (StepKind.PREFILL, 2),
    ]
