"""GGUF -> mlx-lm conversion: name mapping, weights, tokenizer, errors."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest
from mlx_lm import load

from shared.models.gguf.convert import convert_gguf, mlx_tensor_name
from shared.models.gguf.errors import GGUFError
from tests.support.gguf_fixtures import tiny_llama, vocabulary, write_tiny_gguf


@pytest.mark.parametrize(
    ("gguf", "mlx"),
    [
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("token_embd.scales", "model.embed_tokens.scales"),
        ("output_norm.weight", "model.norm.weight"),
        ("output.weight", "lm_head.weight"),
        ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight"),
        ("blk.12.attn_k.biases", "model.layers.12.self_attn.k_proj.biases"),
        ("blk.3.attn_v.scales", "model.layers.3.self_attn.v_proj.scales"),
        ("blk.3.attn_output.weight", "model.layers.3.self_attn.o_proj.weight"),
        ("blk.29.ffn_gate.weight", "model.layers.29.mlp.gate_proj.weight"),
        ("blk.29.ffn_up.weight", "model.layers.29.mlp.up_proj.weight"),
        ("blk.29.ffn_down.weight", "model.layers.29.mlp.down_proj.weight"),
        ("blk.1.attn_norm.weight", "model.layers.1.input_layernorm.weight"),
        ("blk.1.ffn_norm.weight", "model.layers.1.post_attention_layernorm.weight"),
    ],
)
def test_tensor_name_mapping(gguf, mlx):
    assert mlx_tensor_name(gguf) == mlx


@pytest.mark.parametrize("name", ["blk.0.attn_qkv.weight", "rope_freqs.weight", "nonsense"])
def test_unknown_tensor_names_are_refused(name):
    with pytest.raises(GGUFError, match="unsupported tensor"):
        mlx_tensor_name(name)


@pytest.fixture(params=[False, True], ids=["untied", "tied"])
def tiny_gguf(request, tmp_path):
    model = tiny_llama(len(vocabulary()), tie=request.param)
    return model, write_tiny_gguf(tmp_path / "tiny.gguf", model)


def test_converted_model_computes_the_same_logits(tiny_gguf, tmp_path):
    original, path = tiny_gguf
    out = convert_gguf(path, tmp_path / "converted")
    loaded, _ = load(str(out))
    tokens = mx.array([[5, 40, 77, 120, 3, 9, 200, 31]])
    assert mx.allclose(loaded(tokens), original(tokens), atol=1e-5).item()


def test_config_records_architecture(tiny_gguf, tmp_path):
    original, path = tiny_gguf
    config = json.loads((convert_gguf(path, tmp_path / "c") / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["rope_traditional"] is True  # GGUF permutes Q/K for interleaved RoPE
    assert config["num_key_value_heads"] == 2
    assert config["tie_word_embeddings"] == original.args.tie_word_embeddings
    assert config["max_position_embeddings"] == 256
    assert "quantization" not in config  # F32 tensors stay dense


def test_float16_tensors_convert(tmp_path):
    model = tiny_llama(len(vocabulary()))
    path = write_tiny_gguf(tmp_path / "f16.gguf", model, dtype=mx.float16)
    loaded, _ = load(str(convert_gguf(path, tmp_path / "c")))
    tokens = mx.array([[5, 40, 77, 120]])
    ref = model(tokens)
    assert mx.allclose(loaded(tokens).astype(mx.float32), ref, atol=5e-2).item()


def test_tokenizer_special_tokens_and_chat_template(tiny_gguf, tmp_path):
    _, path = tiny_gguf
    _, tokenizer = load(str(convert_gguf(path, tmp_path / "c")))
    vocab = vocabulary()
    assert tokenizer.encode("<|im_start|>", add_special_tokens=False) == [1]
    assert tokenizer.eos_token_id == 2
    assert vocab[tokenizer.encode("hello", add_special_tokens=False)[0]] == "hell"  # merges apply
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    round_trip = tokenizer.decode(tokenizer.encode("héllo wörld 🙂", add_special_tokens=False))
    assert round_trip == "héllo wörld 🙂"


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(GGUFError, match="not found"):
        convert_gguf(tmp_path / "absent.gguf", tmp_path / "out")


def test_corrupt_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00garbage" * 10)
    with pytest.raises(GGUFError, match="corrupt|truncated|unsupported"):
        convert_gguf(bad, tmp_path / "out")


def test_truncated_file_is_a_clear_error(tiny_gguf, tmp_path):
    _, path = tiny_gguf
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(GGUFError):
        convert_gguf(cut, tmp_path / "out")


def test_header_reader_accepts_the_fixture(tiny_gguf):
    from shared.models.gguf.header import read_header

    header = read_header(tiny_gguf[1])
    assert header.version == 3
    assert {t.type_name for t in header.tensors} == {"F32"}
    assert "tokenizer.ggml.tokens" in header.metadata_keys


@pytest.mark.parametrize("cut", [3, 10, 30, 200, 2000])
def test_header_cut_anywhere_is_a_clear_error(tiny_gguf, tmp_path, cut):
    _, path = tiny_gguf
    short = tmp_path / "short.gguf"
    short.write_bytes(path.read_bytes()[:cut])
    with pytest.raises(GGUFError):
        convert_gguf(short, tmp_path / "out")


def test_random_bytes_after_magic_never_crash(tmp_path):
    import random

    rng = random.Random(7)
    for i in range(50):
        bad = tmp_path / f"r{i}.gguf"
        bad.write_bytes(b"GGUF" + bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 400))))
        with pytest.raises(GGUFError):
            convert_gguf(bad, tmp_path / "out")
