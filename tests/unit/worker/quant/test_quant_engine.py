"""The engine over quantized K/V: greedy output, eviction and COW under pressure, disk tier."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from shared.sampling import SamplingParams
from tests.support.engine_fixtures import make_engine, run_to_completion
from tests.support.engine_fixtures import random_prompt as prompt
from tests.unit.worker.quant.conftest import tiny_quantizable_model
from worker.kv.block_io import block_layout, model_fingerprint
from worker.kv.quant import QuantizedKV, check_layout, rotate

GREEDY = SamplingParams(max_tokens=12)
# the held prompts of tests/unit/worker/engine/test_engine.py (lengths and seeds)
HELD = {f"r{i}": n for i, n in enumerate([3, 8, 9, 17, 30, 41, 64, 5])}


def outputs(model, **config) -> dict[str, list[int]]:
    engine = make_engine(model, **config)
    for i, (rid, n) in enumerate(HELD.items()):
        engine.add_request(rid, prompt(n, i), GREEDY)
    out = run_to_completion(engine)
    engine.check_integrity()
    return out


def test_greedy_output_at_8_bits_equals_unquantized_on_the_held_prompts(qmodel):
    plain = outputs(qmodel)
    assert outputs(qmodel, kv_bits=8) == plain
    four = outputs(qmodel, kv_bits=4, kv_group_size=32)
    agree = sum(a == b for rid in plain for a, b in zip(four[rid], plain[rid], strict=True))
    assert agree >= 0.5 * sum(map(len, plain.values()))  # 4 bits drifts; it is not noise


def test_pressure_evicts_and_shares_quantized_blocks_and_keeps_the_pool_whole(qmodel):
    """A pool too small for the batch: preemption, eviction, prefix hits and copy-on-write
    of partially filled shared blocks, with the books checked after every step."""
    engine = make_engine(qmodel, num_blocks=20, kv_bits=8)
    shared = prompt(20, 7)
    for i in range(6):
        engine.add_request(f"s{i}", shared + prompt(3 + i, 50 + i), GREEDY)
    engine.add_request("same", shared, GREEDY)
    engine.add_request("same2", shared, GREEDY)
    steps = 0
    while engine.has_work() and steps < 3000:
        engine.step()
        engine.check_integrity()
        steps += 1
    assert not engine.has_work()
    reference = make_engine(qmodel, kv_bits=8)
    reference.add_request("same", shared, GREEDY)
    again = make_engine(qmodel, num_blocks=20, kv_bits=8)
    again.add_request("same", shared, GREEDY)
    assert run_to_completion(again) == run_to_completion(reference)


PROMPT = [(7 * i + 3) % 97 for i in range(70)]


def disk_engine(model, tmp_path, **overrides):
    config = dict(num_blocks=24, kv_disk_bytes=64 << 20, kv_disk_dir=str(tmp_path), kv_bits=8)
    return make_engine(model, **(config | overrides))


def evict_everything(engine) -> None:
    for i in range(3):
        engine.add_request(f"other{i}", [(11 * j + i) % 97 for j in range(120)], GREEDY)
        run_to_completion(engine)


def test_disk_tier_keeps_quantized_bytes_and_refuses_another_layout(tmp_path):
    model = tiny_quantizable_model("llama")
    first = disk_engine(model, tmp_path)
    first.add_request("a", PROMPT, GREEDY)
    expected = run_to_completion(first)["a"]
    evict_everything(first)
    first.disk.store.flush()
    layout = first.disk.store.layout
    assert layout.dtype == "uint8" and layout.quant == "q8g64/float32/rotated-k"
    assert layout.nbytes * 256 // 72 == 2 * 2 * 8 * 2 * 64 * 4  # 72 of 256 bytes per vector
    stored = first.disk.store.blocks()
    assert stored
    payload = first.disk.store.get(stored[0].block_hash, stored[0].token_ids)
    assert payload is not None and payload.shape == layout.shape
    first.disk.store.close()

    second = disk_engine(model, tmp_path)  # a restart: same model, same layout
    second.add_request("a", PROMPT, GREEDY)
    assert run_to_completion(second)["a"] == expected
    assert second.stats()["disk_hit_tokens"] == 64
    second.check_integrity()
    second.disk.store.close()

    for other in (dict(kv_bits=4), dict(kv_group_size=32), dict(kv_bits=None)):
        engine = disk_engine(model, tmp_path, **other)
        assert engine.stats()["disk_blocks"] == 0, other
        assert engine.disk.store.fingerprint != second.disk.store.fingerprint
        engine.disk.store.close()


def test_fingerprint_of_an_unquantized_layout_is_unchanged_by_the_new_fields(tmp_path):
    model = tiny_quantizable_model("llama")
    plain = make_engine(model)
    layout = block_layout(plain.pool)
    assert layout.quant == "" and "quant" not in repr(layout)
    q8 = block_layout(make_engine(model, kv_bits=8).pool)
    assert model_fingerprint(model, q8) != model_fingerprint(model, layout)
    assert q8.row_bytes == 64 + 2 * 4


@pytest.mark.parametrize("bits", [8, 4])
def test_the_pool_holds_quantized_arrays(bits):
    model = tiny_quantizable_model("llama")
    engine = make_engine(model, kv_bits=bits)
    k = engine.pool.k[0]
    assert k.packed.dtype == mx.uint32 and k.packed.shape[-1] == 64 * bits // 32
    assert engine.attention_report.backend == "mlx"
    assert np.array(k.scales).dtype == np.float32


def test_decode_kv_bytes_count_the_quantized_bytes_read():
    """WorkerPhases.decode_kv_bytes_mean (the roofline's K/V bytes per tick) counts what the
    pool holds: 8 bits in groups of 64 read 1 + 2 * 4 / 64 bytes a value, not float32's 4."""
    model = tiny_quantizable_model("llama")
    means = {}
    for bits in (None, 8):
        engine = make_engine(model, kv_bits=bits)
        engine.add_request("a", prompt(10, 1), SamplingParams(max_tokens=4))
        run_to_completion(engine)
        means[bits] = engine.phases().decode_kv_bytes_mean
    # three decode ticks reading 12, 13, 14 tokens (the one being written included)
    per_token = 2 * 2 * 2 * 64  # K and V x 2 layers x 2 KV heads x head dim 64
    assert means[None] == pytest.approx(13 * per_token * 4)
    assert means[8] == pytest.approx(13 * per_token * (1 + 2 * 4 / 64))


def test_the_pool_holds_rotated_keys_and_plain_values(qmodel):
    """Quantized pools store K rotated (worker.kv.quant.rotate) and V as is: the first layer's
    stored K/V against mlx-lm's own cache of the same prompt, within 8-bit rounding."""
    tokens = prompt(16, 3)
    engine = make_engine(qmodel, kv_bits=8)
    engine.add_request("a", tokens, SamplingParams(max_tokens=1))
    run_to_completion(engine)
    blocks = engine.cache.match_prefix(tokens).block_ids  # the prompt's two full blocks
    slots = mx.array([b * 8 + i for b in blocks for i in range(8)], dtype=mx.int32)
    cache = make_prompt_cache(qmodel)
    qmodel(mx.array(tokens)[None], cache=cache)
    keys, values = (x[0].swapaxes(0, 1) for x in (cache[0].keys, cache[0].values))  # (L, H, D)
    stored_k, stored_v = engine.pool.k[0].take(slots), engine.pool.v[0].take(slots)
    step = float(mx.abs(keys).max()) / 100  # 8-bit groups of 64: well under a hundredth
    assert float(mx.abs(stored_k - rotate(keys[:16])).max()) < step
    assert float(mx.abs(stored_k - keys[:16]).max()) > 10 * step  # not the keys as they were
    assert float(mx.abs(stored_v - values[:16]).max()) < float(mx.abs(values).max()) / 100


def test_rotation_spreads_an_outlier_channel_and_cuts_the_score_error():
    """Keys with one large channel (as trained models' keys have): 8-bit scores q.k are
    about 3x closer to exact when the keys are stored rotated and q rotated alike."""
    rng = np.random.default_rng(0)
    keys = rng.normal(size=(256, 1, 64)).astype(np.float32)
    keys[..., 5] *= 40.0
    query = mx.array(rng.normal(size=(64,)).astype(np.float32))
    keys = mx.array(keys)
    exact = keys[:, 0] @ query

    def score_error(store, q):
        pool = QuantizedKV.zeros(256, 1, 64, bits=8, group_size=64, dtype=mx.float32)
        pool[mx.arange(256)] = store
        return float(mx.abs(pool.take(mx.arange(256))[:, 0] @ q - exact).mean())

    plain, rotated = score_error(keys, query), score_error(rotate(keys), rotate(query))
    assert rotated < plain / 2, (plain, rotated)  # (0.085 vs 0.262 here)


def test_a_head_dim_without_a_hadamard_rotation_is_refused():
    check_layout(96, 8, 32)  # 3 * 32: MLX rotates it
    with pytest.raises(ValueError, match="head_dim 288"):
        check_layout(288, 8, 32)  # 9 * 32
