"""The roofline's arithmetic: the model's bytes and FLOPs, and a run's bound (no timing)."""

from __future__ import annotations

import pytest

from scripts.roofline import Load, Machine, bound, load_of_report, model_cost

SMOLLM2 = {
    "hidden_size": 576,
    "num_hidden_layers": 30,
    "intermediate_size": 1536,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
}


def test_default_model_reads_538_mb_of_float32_weights_per_forward():
    cost = model_cost(SMOLLM2)
    # DESIGN.md: 425 MB of layers + the 113 MB tied head
    assert round(cost.layer_params * 4 / 1e6) == 425
    assert round(cost.head_params * 4 / 1e6) == 113
    assert cost.kv_bytes_per_token == 30 * 2 * 3 * 64 * 4
    assert cost.flops_per_token == 2 * cost.params


def test_a_tick_is_bound_by_bandwidth_at_small_batch_and_by_flops_at_large():
    cost = model_cost(SMOLLM2)
    machine = Machine(read_gb_s=20.0, sgemm_gflop_s=100.0, stream_gb_s=8.0)
    small = bound(Load(1, 0, 0, 10, 1.0, 0.0), cost, machine)
    assert small["tick_bound_by"] == "bandwidth"
    assert small["tick_floor_ms"] == pytest.approx(cost.weight_bytes / 20e9 * 1e3, rel=1e-3)
    large = bound(Load(1, 0, 0, 512, 512.0, 0.0), cost, machine)
    assert large["tick_bound_by"] == "flops"


def test_uncached_prompt_tokens_cost_their_flops_and_cached_ones_nothing():
    cost = model_cost(SMOLLM2)
    machine = Machine(20.0, 100.0, 8.0)
    cold = bound(Load(4, 4000, 0, 40, 4.0, 0.0), cost, machine)
    warm = bound(Load(4, 4000, 3000, 40, 4.0, 0.0), cost, machine)
    assert cold["prefill_floor_s"] == pytest.approx(4 * warm["prefill_floor_s"], rel=1e-3)
    assert warm["bound_requests_per_s"] > cold["bound_requests_per_s"]


def test_a_report_gives_its_load_from_the_workers_phase_metrics():
    report = {
        "completed": 48,
        "prompt_tokens": 26880,
        "cached_tokens": 20000,
        "output_tokens": 1536,
        "concurrency": 16,
        "requests_per_s": 1.0,
        "worker_phases": {
            "w0": {
                "decode_batch_mean": 9.5,
                "decode_kv_bytes_mean": 1e6,
                "decode_tick_p50_ms": 200.0,
            }
        },
    }
    load = load_of_report(report, model_cost(SMOLLM2))
    assert (load.decode_batch, load.kv_bytes_per_tick, load.cached_tokens) == (9.5, 1e6, 20000)


def test_a_prefill_worker_does_not_dilute_the_decoders_kv_per_tick():
    report = {
        "completed": 8,
        "prompt_tokens": 16000,
        "cached_tokens": 0,
        "output_tokens": 384,
        "concurrency": 8,
        "requests_per_s": 0.5,
        "worker_phases": {
            "worker-0": {"decode_batch_mean": 0.0, "decode_kv_bytes_mean": 0.0},  # prefill
            "worker-1": {
                "decode_batch_mean": 6.0,
                "decode_kv_bytes_mean": 4e7,
                "decode_tick_p50_ms": 150.0,
            },
        },
    }
    load = load_of_report(report, model_cost(SMOLLM2))
    assert (load.decode_batch, load.kv_bytes_per_tick) == (6.0, 4e7)
    assert bound(load, model_cost(SMOLLM2), Machine(20.0, 100.0, 8.0))["kv_mb_per_tick"] == 40.0


def test_described_kv_bytes_follow_the_pools_quantized_layout():
    import argparse

    from scripts.roofline import kv_value_bytes

    eight = kv_value_bytes(argparse.Namespace(kv_bits=8, kv_group_size=64))
    assert eight == 1 + 2 * 4 / 64  # packed byte + the group's float32 scale and bias
    assert kv_value_bytes(argparse.Namespace(kv_bits=None, kv_group_size=64)) == 4.0
    assert model_cost(SMOLLM2, bytes_per_value=eight).kv_bytes_per_token == 30 * 2 * 3 * 64 * eight


def test_the_bound_with_shared_prefixes_read_once_is_tighter():
    cost = model_cost(SMOLLM2)
    machine = Machine(20.0, 100.0, 8.0)
    # 8 rows over 2 tenants' 2000-token prefixes: every row's K/V, or each prefix once
    plain, shared = (
        8 * 2050 * cost.kv_bytes_per_token,
        (2 * 2000 + 8 * 50) * cost.kv_bytes_per_token,
    )
    limits = bound(Load(8, 0, 0, 400, 8.0, plain, shared), cost, machine)
    assert limits["tick_floor_shared_ms"] == pytest.approx(
        (cost.weight_bytes + shared) / 20e9 * 1e3, rel=1e-3
    )
    assert limits["tick_floor_shared_ms"] < limits["tick_floor_ms"]
    assert limits["bound_shared_requests_per_s"] > limits["bound_requests_per_s"]
    assert "tick_floor_shared_ms" not in bound(Load(8, 0, 0, 400, 8.0, plain), cost, machine)
