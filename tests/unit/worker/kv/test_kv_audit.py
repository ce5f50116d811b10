"""The engine's KV audit: integrity checks while idle, counted in the heartbeat's load."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from shared.sampling import SamplingParams
from tests.support.engine_fixtures import make_engine, run_to_completion, tiny_model
from worker.engine.stats import KVAudit


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_audit_runs_only_when_idle_and_due_and_counts_failures():
    clock, calls = Clock(), []

    def check():
        calls.append(clock.now)
        if len(calls) == 2:
            raise RuntimeError("free list disagrees")

    audit = KVAudit(check, clock)
    audit.maybe(busy=False)
    assert calls == []  # not due yet
    clock.now = KVAudit.EVERY_S
    audit.maybe(busy=True)
    assert calls == []  # busy: later
    audit.maybe(busy=False)
    clock.now += KVAudit.EVERY_S
    audit.maybe(busy=False)
    clock.now += KVAudit.EVERY_S
    audit.maybe(busy=False)
    assert (audit.checks, audit.failures, len(calls)) == (3, 1, 3)
    assert audit.last_error == "free list disagrees"


def test_engine_load_reports_real_checks_of_its_pool():
    engine = make_engine(tiny_model("llama", seed=5))
    engine.kv_audit.EVERY_S = 0.0
    assert engine.load().kv_checks == 1
    engine.pool._refs[1] = -1  # break an invariant: the next check must say so
    load = engine.load()
    assert (load.kv_checks, load.kv_check_failures) == (2, 1)
    assert "negative ref counts" in engine.kv_audit.last_error


def test_phases_say_what_mlx_holds_beside_the_pool():
    """For a long run's memory reading (scripts/soak): MLX's live arrays hold at least the
    weights and the pool; its buffer cache and the kept prefixes are reported apart."""
    model = tiny_model("llama")
    engine = make_engine(model)
    engine.add_request("a", list(range(20)), SamplingParams(max_tokens=3))
    run_to_completion(engine)
    phases = engine.phases()
    weights = sum(p.nbytes for _, p in tree_flatten(model.parameters()))
    pool = sum(a.nbytes for a in engine.pool.k + engine.pool.v)
    assert phases.mlx_active_mb >= (weights + pool) / 2**20 - 0.1
    assert phases.mlx_active_mb == pytest.approx(mx.get_active_memory() / 2**20, abs=0.1)
    assert phases.mlx_cache_mb >= 0 and phases.prefix_kv_mb >= 0
