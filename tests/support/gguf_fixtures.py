"""Write small llama GGUF files for tests: random weights, a byte-level BPE vocabulary."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models import llama

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["h e", "l l", "he ll", "Ġ w"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_MLX_TO_GGUF = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def vocabulary() -> list[str]:
    from tokenizers import pre_tokenizers

    merged = [m.replace(" ", "") for m in MERGES]
    return SPECIAL + sorted(pre_tokenizers.ByteLevel.alphabet()) + merged


def tiny_llama(vocab_size: int, tie: bool = False, seed: int = 0) -> llama.Model:
    mx.random.seed(seed)
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=vocab_size,
        rope_theta=10000.0,
        rope_traditional=True,
        tie_word_embeddings=tie,
        head_dim=16,
    )
    model = llama.Model(args)
    mx.eval(model.parameters())
    return model


def gguf_name(mlx_name: str) -> str:
    if mlx_name.startswith("model.layers."):
        _, _, layer, rest = mlx_name.split(".", 3)
        module, kind = rest.rsplit(".", 1)
        return f"blk.{layer}.{_MLX_TO_GGUF[module]}.{kind}"
    globals_ = {
        "model.embed_tokens": "token_embd",
        "model.norm": "output_norm",
        "lm_head": "output",
    }
    module, kind = mlx_name.rsplit(".", 1)
    return f"{globals_[module]}.{kind}"


def write_tiny_gguf(path: Path, model: llama.Model, dtype=mx.float32) -> Path:
    args = model.args
    tokens = vocabulary()
    arrays = {gguf_name(k): v.astype(dtype) for k, v in tree_flatten(model.parameters())}
    u32 = lambda v: mx.array(v, dtype=mx.uint32)  # noqa: E731
    meta = {
        "general.architecture": "llama",
        "general.name": "tiny-test-llama",
        "llama.embedding_length": u32(args.hidden_size),
        "llama.block_count": u32(args.num_hidden_layers),
        "llama.feed_forward_length": u32(args.intermediate_size),
        "llama.attention.head_count": u32(args.num_attention_heads),
        "llama.attention.head_count_kv": u32(args.num_key_value_heads),
        "llama.rope.dimension_count": u32(args.head_dim),
        "llama.attention.layer_norm_rms_epsilon": mx.array(args.rms_norm_eps),
        "llama.rope.freq_base": mx.array(args.rope_theta),
        "llama.context_length": u32(256),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": MERGES,
        "tokenizer.ggml.token_type": mx.array(
            [3] * len(SPECIAL) + [1] * (len(tokens) - len(SPECIAL)), dtype=mx.int32
        ),
        "tokenizer.ggml.bos_token_id": u32(0),
        "tokenizer.ggml.eos_token_id": u32(2),
        "tokenizer.chat_template": CHAT_TEMPLATE,
    }
    mx.save_gguf(str(path), arrays, meta)
    return path
