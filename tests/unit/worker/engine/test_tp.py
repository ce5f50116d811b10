"""Tensor-parallel groups (worker/tp/runner.py): the plan codec, the shardability checks, and real
rank processes in a ring over loopback whose greedy tokens must equal the unsharded engine's."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.models import llama

from shared.sampling import SamplingParams
from shared.tensor_parallel import GroupError, check_divides
from tests.support.engine_fixtures import reference_greedy, run_to_completion, tiny_model
from tests.support.tp_group import (
    TINY_TP_ARGS,
    TINY_TP_QUANT_ARGS,
    TINY_TP_QWEN3_ARGS,
    rank_logs,
    run_group_case,
    save_tiny_model,
    start_group_case,
)
from tests.support.tp_rank_main import run_phases
from tests.unit.worker.engine.test_no_host_sync import counting_host_reads
from worker.config import EngineConfig
from worker.engine.engine import Engine
from worker.runner.layer_cache import CacheEntries, CacheLayout
from worker.runner.layer_groups import WINDOW, LayerKind
from worker.runner.model_runner import Row
from worker.runner.model_support import UnsupportedModel
from worker.tp.runner import (
    EXIT_GROUP_LOST,
    LeaderRunner,
    Watchdog,
    WireStep,
    check_shardable,
    decode_step,
    encode_step,
)
from worker.tp.start import ring_env_from_hosts


def test_step_codec_round_trips_rows_copies_and_device_tokens():
    step = WireStep(
        rows=[Row([5, 6, 7], 16, [3, 9, 4]), Row([1], 0, [2])], samples=True, copies=[(4, 11)]
    )
    assert decode_step(encode_step(step), []) == step
    decode = WireStep([Row([0], 8, [1, 2]), Row([0], 3, [5])], samples=True, copies=[])
    got = decode_step(encode_step(decode), [42, 17])
    assert [r.tokens for r in got.rows] == [[42], [17]]
    assert [r.block_ids for r in got.rows] == [[1, 2], [5]]


def test_the_leader_refuses_a_layout_its_followers_cannot_run():
    """Followers run every layer paged, full attention, one cache entry each: the leader
    refuses any other layout, as its runner is made and as the probe settles the modes."""
    plain = CacheLayout((LayerKind(),) * 2, (False, False))
    LeaderRunner.refuse_unless_plain(plain)
    windowed = CacheLayout((LayerKind(WINDOW, 4), LayerKind()), (False, False))
    for layout in (plain.with_modes([True, False]), windowed):
        with pytest.raises(UnsupportedModel, match="every layer is plain full attention"):
            LeaderRunner.refuse_unless_plain(layout)
    listed = CacheLayout(plain.kinds, plain.gathered, CacheEntries(sizes=(2,), lists=(True,)))
    with pytest.raises(UnsupportedModel, match="CacheList"):
        LeaderRunner.refuse_unless_plain(listed)


def test_group_size_must_divide_heads_and_mlp():
    default_model = {"num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536}
    check_divides(default_model, 3)
    with pytest.raises(GroupError, match="KV heads"):
        check_divides(default_model, 2)
    with pytest.raises(GroupError, match="query heads"):
        check_divides({"num_attention_heads": 6, "num_key_value_heads": 2}, 4)


def test_model_without_shard_is_refused():
    model = llama.Model(llama.ModelArgs.from_dict(TINY_TP_ARGS))
    check_shardable(model, 2)
    model.shard = None  # as a model type whose mlx-lm module has no shard()
    with pytest.raises(GroupError, match="no tensor-parallel shard"):
        check_shardable(model, 2)


@pytest.fixture(scope="module")
def tiny_tp_model(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tp-model"))


def unsharded_outputs(model_dir, case) -> dict[str, list[int]]:
    from shared.models.loading import load_model

    model, _ = load_model(model_dir, "float32")
    engine = Engine.create(model, EngineConfig(**case["config"]), max_context=case["max_context"])
    outputs = run_phases(engine, case["phases"])
    return outputs, engine.stats()


def prompt(seed: int, length: int) -> list[int]:
    return [(seed * 31 + 7 * i) % 96 + 1 for i in range(length)]


SHARED = prompt(1, 40)
CASE = {
    # 26 usable blocks of 8 tokens: the second phase's batch does not fit and is preempted
    "config": dict(
        block_size=8, num_blocks=27, prefill_chunk=16, step_token_budget=48, warmup=True
    ),
    "max_context": 512,
    "phases": [
        [  # chunked prefill (40 tokens, chunks of 16) and decode in one batch
            {"id": "a", "prompt": SHARED, "max_tokens": 10},
            {"id": "b", "prompt": prompt(2, 5), "max_tokens": 14},
        ],
        [  # cache hits on a's prefix, a forked request (copy on write), preemption
            {"id": "c", "prompt": SHARED + prompt(3, 9), "max_tokens": 30},
            {"id": "d", "prompt": SHARED[:24] + prompt(4, 3), "max_tokens": 40},
            {"id": "e", "prompt": prompt(5, 30), "max_tokens": 40, "n": 2},
        ],
    ],
}


def test_tp2_group_greedy_equals_unsharded_engine(tiny_tp_model, tmp_path):
    check_group_equals_unsharded(tiny_tp_model, tmp_path)


@pytest.mark.slow
def test_tp2_qwen3_group_greedy_equals_unsharded_engine(tmp_path):
    model_dir = save_tiny_model(tmp_path / "qwen3", args=TINY_TP_QWEN3_ARGS)
    check_group_equals_unsharded(model_dir, tmp_path)


@pytest.mark.slow
def test_tp2_group_with_speculative_decoding_equals_unsharded_engine(tiny_tp_model, tmp_path):
    """Decode rows carrying n-gram drafts (several tokens, K/V rolled back when rejected)."""
    case = {**CASE, "config": {**CASE["config"], "speculative": "ngram"}}
    got = check_group_equals_unsharded(tiny_tp_model, tmp_path, case, preempts=False)
    assert got["stats"]["spec_drafted"] > 0


@pytest.mark.slow
def test_tp2_group_with_8_bit_kv_equals_the_unsharded_8_bit_engine(tmp_path):
    """Each rank quantizes its own KV heads, per head vector in groups of 32: the same values
    as the one-process pool, so the same greedy tokens through chunked prefill, cache hits,
    a fork's copy-on-write (made on the follower's quantized pool too) and preemption."""
    model_dir = save_tiny_model(tmp_path / "quant", args=TINY_TP_QUANT_ARGS)
    config = {**CASE["config"], "kv_bits": 8, "kv_group_size": 32}
    got = check_group_equals_unsharded(model_dir, tmp_path, {**CASE, "config": config})
    assert got["kv_layout"] == "q8g32"
    follower_log = (tmp_path / "rank1.log").read_text()  # the pool the leader told it to build
    assert "KV heads, head dim 32, mlx.core.float32, q8g32)" in follower_log, follower_log[-2000:]


def check_group_equals_unsharded(model_dir, tmp_path, case=CASE, preempts=True):
    expected, expected_stats = unsharded_outputs(model_dir, case)
    assert expected_stats["cache_hit_tokens"] > 0
    assert expected_stats["preemptions"] > 0 or not preempts
    got = run_group_case(model_dir, case, size=2, workdir=tmp_path, timeout=120)
    assert got["outputs"] == expected
    assert got["stats"]["cache_hit_tokens"] == expected_stats["cache_hit_tokens"]
    assert got["stats"]["preemptions"] == expected_stats["preemptions"]
    return got


IDLE_CASE = {
    "config": dict(block_size=8, num_blocks=32, prefill_chunk=16, step_token_budget=48),
    "max_context": 512,
    "phases": [[{"id": "a", "prompt": prompt(6, 12), "max_tokens": 4}]],
    "idle_s": 60,
    "timeout_s": 3,
}


@contextlib.contextmanager
def idle_group(model_dir, workdir, size=2):
    """A group that served one request and now idles (leader keepalives); killed on exit."""
    procs, out = start_group_case(model_dir, IDLE_CASE, size, workdir)
    try:
        deadline = time.monotonic() + 60
        while not out.exists():
            alive = all(p.poll() is None for p in procs)
            assert alive and time.monotonic() < deadline, rank_logs(workdir, size)
            time.sleep(0.1)
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait()


def exit_code_within(proc, seconds: float) -> int | None:
    try:
        return proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return None


@pytest.mark.parametrize("victim", [pytest.param(0, marks=pytest.mark.slow), 1])
def test_a_dead_rank_makes_the_rest_of_the_group_exit(tiny_tp_model, tmp_path, victim):
    with idle_group(tiny_tp_model, tmp_path) as procs:
        procs[victim].kill()
        assert exit_code_within(procs[1 - victim], 15) == EXIT_GROUP_LOST, rank_logs(tmp_path, 2)


@pytest.mark.slow
def test_a_stalled_rank_trips_the_watchdog(tiny_tp_model, tmp_path):
    """A peer alive but silent (SIGSTOP) raises nothing in the ring: the leader's keepalive
    waits in its all_sum, and the watchdog (timeout 3 s here) ends it."""
    with idle_group(tiny_tp_model, tmp_path) as procs:
        procs[1].send_signal(signal.SIGSTOP)
        assert exit_code_within(procs[0], 20) == EXIT_GROUP_LOST, rank_logs(tmp_path, 2)


def test_leader_queues_pipelined_steps_without_host_reads():
    """The leader's broadcast of a pipelined decode step carries the in-flight tokens inside
    the all_sum, lazily: building the step reads nothing on the host. (A one-process group:
    the same code path; all_sum is then the identity.)"""
    group = mx.distributed.init()
    assert group.size() == 1
    model = tiny_model("llama")
    config = EngineConfig(block_size=8, num_blocks=64, prefill_chunk=64, warmup=False)
    make_runner = LeaderRunner.factory(group, Watchdog(3600, "test"))
    engine = Engine.create(model, config, max_context=512, make_runner=make_runner)
    original_run, reads, pipelined = engine.runner.run, [], []

    def run(plan, device_tokens=None, times=None):
        if device_tokens is None or times is not None:
            return original_run(plan, device_tokens, times)
        with counting_host_reads(reads):
            out = original_run(plan, device_tokens, times)
        pipelined.append(len(plan.decode))
        return out

    engine.runner.run = run
    prompts = {f"r{i}": [(5 * i + j) % 97 for j in range(9 + 4 * i)] for i in range(3)}
    for rid, p in prompts.items():
        engine.add_request(rid, p, SamplingParams(max_tokens=16))
    outputs = run_to_completion(engine)
    assert len(pipelined) >= 8 and reads == [], sorted(set(reads))
    for rid, p in prompts.items():
        assert outputs[rid] == reference_greedy(model, p, 16)


def test_tp_hosts_become_an_mlx_ring_hostfile(monkeypatch):
    monkeypatch.setenv("MLX_RANK", "")
    monkeypatch.setenv("MLX_HOSTFILE", "")
    ring_env_from_hosts(("127.0.0.1", "localhost:6001"), rank=1, default_port=52100)
    assert os.environ["MLX_RANK"] == "1"
    ring = json.loads(Path(os.environ["MLX_HOSTFILE"]).read_text())
    assert ring == [["127.0.0.1:52100"], ["127.0.0.1:6001"]]  # names resolved: ring wants IPs
    Path(os.environ["MLX_HOSTFILE"]).unlink()


def test_a_ranks_kv_fingerprint_names_its_shard_and_quantization():
    """Blocks of rank 0 of 2 hold other KV heads than an unsharded worker's of the same
    layout: its disk files and peer fetches must never be taken for theirs."""
    from worker.kv.block_io import block_layout, model_fingerprint
    from worker.kv.block_pool import BlockPool
    from worker.tp.runner import shard

    model = llama.Model(llama.ModelArgs.from_dict(TINY_TP_QUANT_ARGS))
    dims = dict(num_layers=2, num_kv_heads=1, head_dim=32, dtype=mx.float32)
    plain, quant = BlockPool(4, 8, **dims), BlockPool(4, 8, **dims, kv_bits=8, kv_group_size=32)
    unsharded = {model_fingerprint(model, block_layout(p)) for p in (plain, quant)}
    shard(model, mx.distributed.init())  # a group of one: the same weights, a shard tag
    assert model.tp_shard == "rank 0 of 1"
    sharded = {model_fingerprint(model, block_layout(p)) for p in (plain, quant)}
    assert len(unsharded | sharded) == 4
