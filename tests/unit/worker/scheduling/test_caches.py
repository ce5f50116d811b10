"""The cache coordinator (worker/engine/caches/): each model gets the kinds its layers need,
the hit rule is theirs at once, what the fleet must not do is said with the reason, and a new
kind plugs in as one class: the scheduler asks it without knowing it."""

from __future__ import annotations

import pytest

from shared.prefix.hit_rule import HitRule
from shared.sampling import SamplingParams
from tests.support.arch_zoo import build
from tests.support.engine_fixtures import (
    make_engine,
    reference_greedy,
    run_to_completion,
    tiny_model,
)
from worker.engine.caches import CacheKind, StateKind, TailKind, WindowKind
from worker.kv.errors import IntegrityError
from worker.runner.plan import RequestKey


@pytest.mark.parametrize(
    ("model", "kinds", "disk"),
    [
        (lambda: tiny_model("llama"), [TailKind], None),
        (lambda: build("gemma3_text"), [WindowKind, TailKind], "window pages"),
        (lambda: build("qwen3_next"), [StateKind, TailKind], "recurrent states"),
        (lambda: build("baichuan_m1"), [WindowKind, StateKind, TailKind], "window pages"),
    ],
)
def test_each_model_gets_the_kinds_its_layers_need(model, kinds, disk):
    kv = make_engine(model()).scheduler.kv
    assert [type(k) for k in kv.kinds] == kinds
    assert kv.rule.snapshots == (StateKind in kinds)
    assert (kv.rule.window_blocks > 0) == (WindowKind in kinds)
    refused = kv.cannot("disk")
    assert refused is None if disk is None else disk in refused
    assert (kv.cannot("drafts") is not None) == (StateKind in kinds)


class EveryOtherBlock(CacheKind):
    """A made-up kind: it keeps its part only after even blocks, and counts what it is told."""

    name = "test kind"

    def __init__(self):
        self.calls: dict[str, int] = {}

    def rule(self) -> HitRule:
        return HitRule(snapshots=True)

    def kept(self, block_hash: int) -> bool:
        self.calls["kept"] = self.calls.get("kept", 0) + 1
        return block_hash % 2 == 0

    def start(self, seq, hit) -> None:
        self.calls["start"] = self.calls.get("start", 0) + 1
        assert hit.snapshot is None or hit.snapshot % 2 == 0

    def release(self, seq) -> None:
        self.calls["release"] = self.calls.get("release", 0) + 1


def test_a_new_kind_is_one_class_the_scheduler_asks_without_knowing_it():
    model = tiny_model("llama", seed=2)
    engine = make_engine(model)
    kind = EveryOtherBlock()
    engine.scheduler.kv.register(kind)
    prompt = [(5 * i + 3) % 90 + 2 for i in range(60)]
    want = reference_greedy(model, prompt, 6)
    outputs = {}
    for rid in ("first", "again"):
        engine.add_request(rid, prompt, SamplingParams(max_tokens=6))
        outputs |= run_to_completion(engine)
    assert outputs["first"] == outputs["again"] == want
    assert kind.calls["start"] == 2 and kind.calls["release"] == 2 and kind.calls["kept"] > 0
    engine.check_integrity()


def test_windows_and_states_at_once_under_pool_pressure_match_mlx_lm():
    """baichuan_m1 keeps window pages and recurrent states: its hits must end where both are
    kept (a cut for one, then the other, could end where window pages are gone), and a batch
    in a pool too small for it (the tree evicts) stays greedy-equal."""
    model = build("baichuan_m1")
    engine = make_engine(model, num_blocks=16, max_running=6, prefill_chunk=16)
    system = [(3 * i + 1) % 90 + 2 for i in range(24)]
    prompts = {f"p{i}": system + [(7 * j + i) % 90 + 2 for j in range(9 + 5 * i)] for i in range(5)}
    want = {rid: reference_greedy(model, p, 8) for rid, p in prompts.items()}
    for rid, prompt in prompts.items():
        engine.add_request(rid, prompt, SamplingParams(max_tokens=8))
    assert run_to_completion(engine) == want
    assert engine.cache.evicted_blocks > 0  # the pool ran out: the tree gave blocks back
    engine.check_integrity()
    engine.add_request("again", prompts["p4"], SamplingParams(max_tokens=8))
    finals = {}
    while engine.has_work():
        finals |= {d.request_id: d for d in engine.step() if d.finish_reason}
    assert finals["again"].usage.cached_tokens > 0  # a hit both kinds agreed on
    engine.check_integrity()


def test_what_the_kv_manager_keeps_per_sequence_goes_with_it():
    """Window pages released, snapshot points, kept states and prefix locks are kept by the
    KV manager and its kinds per running sequence: after forks, aborts and preemptions none
    is left behind, and the integrity check says so when one is."""
    model = build("baichuan_m1")
    engine = make_engine(model, num_blocks=16, max_running=4, prefill_chunk=16)
    system = [(3 * i + 1) % 90 + 2 for i in range(16)]
    for i in range(4):
        prompt = system + [(5 * j + i) % 90 + 2 for j in range(3 + 2 * i)]
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=24), n=2 if i == 1 else 1)
    for _ in range(4):
        engine.step()
    engine.check_integrity()  # mid-run: the running sequences' records only
    engine.abort("r3")
    run_to_completion(engine)
    assert engine.stats_.preemptions > 0
    engine.check_integrity()
    assert not [k for k in engine.kv.kinds if list(k.records())]
    engine.kv.kinds[0].released[RequestKey("gone", 0)] = 1  # as a leak would leave it
    with pytest.raises(IntegrityError, match="not running"):
        engine.check_integrity()
