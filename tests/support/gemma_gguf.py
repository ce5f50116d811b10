"""Write a tiny gemma3 GGUF for tests, the way llama.cpp's converter writes one.

The weights come from a random mlx-lm `gemma3_text` model; the file holds them in several
GGUF types (F32 norms plus one, F16, Q8_0, Q5_0, and K-quants with random blocks), and the
reference model is given back exactly what the file encodes (each quantized tensor
dequantized by `gguf`), so a converted copy must compute the same logits.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models import gemma3_text

SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
PIECES = ["\n", "▁", *"abcdehilmnorstuwy", "he", "ll", "hell", "hello", "▁w", "or", "▁wor"]
PIECES += ["ld", "▁world", "▁h", "▁hello"]
VOCAB = SPECIAL + PIECES
Q = GGMLQuantizationType
# GGUF name part -> the type the fixture stores it in (norms are always F32)
TYPES = {
    "token_embd": Q.Q8_0,
    "attn_q": Q.Q5_0,
    "attn_output": Q.Q4_K,
    "ffn_down": Q.Q6_K,
    "attn_k": Q.F16,
}
_K_SCALE_BYTES = {Q.Q4_K: (0, 2), Q.Q6_K: (208,)}  # where each block's float16 scales lie

_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}


def tiny_gemma3(seed: int = 0, layers: int = 6) -> gemma3_text.Model:
    """A random gemma3_text model, tied embeddings; widths that fit K-quant 256-blocks."""
    mx.random.seed(seed)
    args = gemma3_text.ModelArgs(
        model_type="gemma3_text",
        hidden_size=64,
        num_hidden_layers=layers,
        intermediate_size=256,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=128,
        query_pre_attn_scalar=128,  # llama.cpp scales by head_dim (all sizes but 27B)
        vocab_size=len(VOCAB),
        sliding_window=8,
        max_position_embeddings=512,
    )
    model = gemma3_text.Model(args)
    model.sanitize({})  # no lm_head: tied, as Gemma is
    params = tree_flatten(model.parameters())
    model.update(tree_unflatten([(k, mx.random.normal(v.shape) * 0.5) for k, v in params]))
    mx.eval(model.parameters())
    return model


def gguf_name(mlx_name: str) -> str:
    if mlx_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if mlx_name == "model.norm.weight":
        return "output_norm.weight"
    _, _, layer, rest = mlx_name.split(".", 3)
    return f"blk.{layer}.{_NAMES[rest.removesuffix('.weight')]}.weight"


def _encode(name: str, values: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, Q]:
    """(bytes or floats to write, their type); K-quants get random blocks, small scales."""
    part = name.split(".")[-2]
    qtype = Q.F32 if name.endswith("norm.weight") else TYPES.get(part, Q.F32)
    if qtype in _K_SCALE_BYTES:
        from gguf.constants import GGML_QUANT_SIZES

        block, size = GGML_QUANT_SIZES[qtype]
        blocks = rng.integers(0, 256, (values.size // block, size), dtype=np.uint8)
        for at in _K_SCALE_BYTES[qtype]:
            blocks[:, at : at + 2] = np.full((len(blocks), 1), 0.002, np.float16).view(np.uint8)
        return blocks.reshape(values.shape[0], -1), qtype
    if qtype in (Q.F32, Q.F16):
        return values.astype(np.float32 if qtype == Q.F32 else np.float16), qtype
    return quantize(values, qtype), qtype


def write_tiny_gemma3_gguf(path: Path, model: gemma3_text.Model, seed: int = 0) -> Path:
    """Write `model` as a gemma3 GGUF; `model` is updated to hold what the file encodes."""
    rng = np.random.default_rng(seed)
    args = model.args
    writer = GGUFWriter(str(path), "gemma3")
    writer.add_name("tiny-test-gemma3")
    for key, value in {
        "context_length": args.max_position_embeddings,
        "embedding_length": args.hidden_size,
        "block_count": args.num_hidden_layers,
        "feed_forward_length": args.intermediate_size,
        "attention.head_count": args.num_attention_heads,
        "attention.head_count_kv": args.num_key_value_heads,
        "attention.key_length": args.head_dim,
        "attention.value_length": args.head_dim,
        "attention.sliding_window": args.sliding_window,
    }.items():
        writer.add_uint32(f"gemma3.{key}", value)
    writer.add_float32("gemma3.attention.layer_norm_rms_epsilon", args.rms_norm_eps)
    writer.add_float32("gemma3.rope.freq_base", args.rope_theta)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(VOCAB)
    writer.add_token_scores([-1000.0] * len(SPECIAL) + [-float(i) for i in range(len(PIECES))])
    writer.add_token_types([3] * len(SPECIAL) + [4] + [1] * (len(PIECES) - 1))
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(True)
    encoded = {}
    for name, value in tree_flatten(model.parameters()):
        values = np.array(value.astype(mx.float32))
        gname = gguf_name(name)
        if gname.endswith("norm.weight"):
            values = values + 1.0  # llama.cpp stores Gemma's norms as 1 + weight
        data, qtype = _encode(gname, values, rng)
        writer.add_tensor(gname, data, raw_dtype=None if qtype in (Q.F32, Q.F16) else qtype)
        decoded = dequantize(data, qtype)
        decoded = decoded.reshape(values.shape) - (1.0 if gname.endswith("norm.weight") else 0)
        encoded[name] = mx.array(decoded.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    model.update(tree_unflatten(list(encoded.items())))
    return path
