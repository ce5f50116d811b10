"""Hybrid models (recurrent layers beside or instead of attention: `tests.support.arch_zoo`'s
RECURRENT) are served with their states in the state pool (`worker.state`), with greedy
output equal to mlx-lm's own `generate_step` alone:

- prompts of different lengths decoded together, in 16-token prefill chunks;
- a second conversation turn (the first prompt, its reply and a new message) starting from
  the snapshot at the first prompt's last whole block: only the tokens after it computed;
- forked into two choices from one prefill (n = 2), each choice with its own state;
- preempted and resumed under a pool too small for the batch;
- a prefix several prompts share: the second prompt snapshots where it left the cached
  tree, and the third starts there;
- a three-turn chat: each turn after the first starts from the snapshot its previous reply
  left at its last whole block, and computes only its new message.
"""

from __future__ import annotations

import pytest

from shared.kv_events import StateSnapshotsDropped, StateSnapshotsStored
from tests.support.arch_zoo import ARCHITECTURES, RECURRENT, build, runs_here
from tests.support.engine_fixtures import make_engine, reference_greedy
from tests.unit.worker.models.test_every_architecture import MAX_TOKENS, _prompt, _run

HYBRIDS = sorted(a for a in RECURRENT if a in ARCHITECTURES and runs_here(a))
# the list: each also runs preempted
REQUIRED = [
    "qwen3_5",
    "qwen3_next",
    "nemotron_h",
    "granitemoehybrid",
    "lfm2",
    "kimi_linear",
    "mamba2",
    "falcon_h1",
]


@pytest.mark.parametrize("arch", HYBRIDS)
def test_hybrid_served_batched_chunked_and_from_a_snapshot(arch):
    model = build(arch)
    engine = make_engine(model, prefill_chunk=16, step_token_budget=48)
    assert engine.states is not None
    prompts = {"a": _prompt(5, 0), "b": _prompt(23, 1), "c": _prompt(41, 2)}
    expected = {rid: reference_greedy(model, p, MAX_TOKENS) for rid, p in prompts.items()}
    tokens, _ = _run(engine, {rid: (p, 1) for rid, p in prompts.items()})
    assert {rid: tokens[(rid, 0)] for rid in prompts} == expected

    # the next turn: "c", its reply, a new message; from the snapshot at "c"'s block 40
    turn = prompts["c"] + expected["c"] + _prompt(11, 3)
    want = reference_greedy(model, turn, MAX_TOKENS)
    tokens, usage = _run(engine, {"d": (turn, 2)})
    assert tokens[("d", 0)] == tokens[("d", 1)] == want
    assert usage["d"].cached_tokens == 40  # (41 - 1) // 8 * 8: only what follows computed
    assert engine.states.pool.snapshot_hits >= 1
    engine.check_integrity()


@pytest.mark.parametrize("arch", REQUIRED)
def test_hybrid_preempted_and_resumed_match_mlx_lm(arch):
    model = build(arch)
    # 10 blocks of 8 tokens: the batch outgrows them while it decodes (a prefill is never
    # folded for these models, so admission paces itself and 12 blocks would not preempt)
    engine = make_engine(model, num_blocks=10, max_running=6, prefill_chunk=16)
    prompts = {f"p{i}": _prompt(17 + 6 * i, i) for i in range(5)}
    expected = {rid: reference_greedy(model, p, MAX_TOKENS) for rid, p in prompts.items()}
    tokens, _ = _run(engine, {rid: (p, 1) for rid, p in prompts.items()})
    assert {rid: tokens[(rid, 0)] for rid in prompts} == expected
    assert engine.stats()["preemptions"] > 0
    engine.check_integrity()


def test_shared_prefix_snapshot_where_the_prompt_left_the_tree():
    model = build("qwen3_next")
    engine = make_engine(model, prefill_chunk=64)
    system = _prompt(24, 7)  # three blocks of 8
    first, second, third = (system + _prompt(13, salt) for salt in (1, 2, 3))
    _, usage = _run(engine, {"first": (first, 1)})
    assert usage["first"].cached_tokens == 0
    # the tree holds the system prompt's K/V but no state there: computed again, and
    # snapshotted where this prompt leaves the tree
    _, usage = _run(engine, {"second": (second, 1)})
    assert usage["second"].cached_tokens == 0
    tokens, usage = _run(engine, {"third": (third, 1)})
    assert usage["third"].cached_tokens == 24
    assert tokens[("third", 0)] == reference_greedy(model, third, MAX_TOKENS)
    events = engine.kv_events.drain()  # what the worker sends the router
    stored = [h for e in events if isinstance(e, StateSnapshotsStored) for h in e.block_hashes]
    # each prompt's last whole block (32), the second's branch point (24), and each
    # reply's last whole block (40: 37 prompt tokens and 5 generated, the last never run)
    assert len(stored) == len(set(stored)) == 7
    engine.check_integrity()


@pytest.mark.parametrize("arch", ["qwen3_next", "mamba2"])
def test_chat_turns_compute_only_their_new_message(arch):
    model = build(arch)
    engine = make_engine(model, prefill_chunk=16)
    bs, history, cached = engine.block_size, _prompt(21, 4), 0
    for turn in range(3):
        tokens, usage = _run(engine, {f"t{turn}": (history, 1)}, max_tokens=11)
        reply = tokens[(f"t{turn}", 0)]
        assert reply == reference_greedy(model, history, 11)
        assert usage[f"t{turn}"].cached_tokens == cached
        # next turn: the previous prompt and reply's whole blocks (its last token never ran)
        cached = (len(history) + len(reply) - 1) // bs * bs
        history = history + reply + _prompt(6, turn)
    engine.check_integrity()


def test_the_heartbeat_counts_state_slots_and_the_copies_running_replies_keep():
    from shared.sampling import SamplingParams

    engine = make_engine(build("mamba2"), max_running=2)
    pool, bs = engine.states.pool, engine.block_size
    engine.add_request("r", _prompt(10, 3), SamplingParams(max_tokens=3 * bs))
    kept = []
    while engine.has_work():
        engine.step()
        kept.append(engine.load().state_kept)
    load = engine.load()
    assert load.state_slots == pool.num_slots > 0
    # a copy is kept once the reply passes a block boundary, and published when it finishes
    assert max(kept) == 1 and kept[0] == 0 and load.state_kept == 0
    engine.check_integrity()


def test_snapshots_are_bounded_and_their_drops_announced():
    model = build("mamba2")
    engine = make_engine(model, max_running=2, state_snapshots=2)
    pool = engine.states.pool
    taken = pool.snapshots_taken  # (the load-time check's, forgotten since)
    assert not pool.snapshots
    for salt in range(4):
        _run(engine, {f"r{salt}": (_prompt(20, 10 * salt), 1)})
    # each: its prompt's last whole block (16) and its reply's (24: 20 + 5 - 1 computed)
    assert len(pool.snapshots) == 2 and pool.snapshots_taken - taken == 8
    assert pool.snapshot_bytes == 2 * pool.bytes_per_slot
    load = engine.load()  # what the heartbeat reports (/v1/cluster, /metrics)
    assert (load.state_snapshots, load.state_snapshot_bytes) == (2, pool.snapshot_bytes)
    events = engine.kv_events.drain()
    dropped = [h for e in events if isinstance(e, StateSnapshotsDropped) for h in e.block_hashes]
    assert len(dropped) == 6
    engine.check_integrity()


def test_no_snapshots_no_hits():
    model = build("lfm2")
    engine = make_engine(model, state_snapshots=0)
    prompt = _prompt(30, 5)
    _run(engine, {"a": (prompt, 1)})
    tokens, usage = _run(engine, {"b": (prompt + _prompt(9, 1), 1)})
    assert usage["b"].cached_tokens == 0
    assert tokens[("b", 0)] == reference_greedy(model, prompt + _prompt(9, 1), MAX_TOKENS)


def test_every_hybrid_is_served():
    """LongCat-Flash's n-gram variant among them: an n-gram state beside two MLA blocks per
    layer, and a state that grows to its size over the first tokens."""
    assert "longcat_flash_ngram" in HYBRIDS
    assert set(REQUIRED) <= set(HYBRIDS)


@pytest.mark.parametrize("length", [24, 21])  # the prompt ends on a block boundary, or in one
def test_a_turn_that_rewrites_the_reply_starts_from_the_prompts_last_block(length):
    # the next turn's history leaves the reply where it began (a template that drops the
    # reasoning, scripts/history_reuse.py): the states at the prompt's last block boundary at
    # or before its end are kept, though the reply ran two blocks past it
    model = build("mamba2")
    engine = make_engine(model, prefill_chunk=16)
    bs, first = engine.block_size, _prompt(length, 5)
    tokens, _ = _run(engine, {"a": (first, 1)}, max_tokens=2 * bs + 3)
    turn = first + _prompt(9, 6)
    assert turn[length] != tokens[("a", 0)][0]
    tokens, usage = _run(engine, {"b": (turn, 1)}, max_tokens=4)
    assert usage["b"].cached_tokens == length // bs * bs
    assert tokens[("b", 0)] == reference_greedy(model, turn, 4)
    engine.check_integrity()
