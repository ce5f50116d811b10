"""The shared sizes every zoo config starts from, so each entry lists only what it changes."""

from __future__ import annotations

VOCAB = 128
WINDOW = 8  # sliding-window width: prompts of 20+ tokens run past it
CHUNK = 8  # llama4's chunked-attention span (and its query temperature's step, floor_scale)

# the llama-shaped fields most architectures read (from_dict drops those a ModelArgs lacks)
DENSE = dict(
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rms_norm_eps=1e-5,
    vocab_size=VOCAB,
    max_position_embeddings=512,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    attention_bias=False,
    mlp_bias=False,
)
# a mixture of experts: 4 experts of which 2 are routed, one shared
EXPERTS = dict(
    num_experts=4,
    num_local_experts=4,
    n_routed_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    n_shared_experts=1,
    num_shared_experts=1,
    shared_expert_intermediate_size=32,
    norm_topk_prob=True,
    routed_scaling_factor=1.0,
    n_group=1,
    topk_group=1,
    first_k_dense_replace=1,
)
# multi-head latent attention (DeepSeek V2 and its descendants)
LATENT = dict(
    kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16
)
# the linear-attention half of a gated-delta hybrid (Qwen3-Next and its family)
GATED_DELTA = dict(
    linear_num_value_heads=4,
    linear_num_key_heads=2,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=3,
)


def cfg(model_type: str, *bases: dict, **fields) -> dict:
    """A config.json-style dict: `bases` merged in order, then `fields`, then its model type."""
    merged: dict = {}
    for base in bases:
        merged.update(base)
    return {**merged, **fields, "model_type": model_type}


def dense(model_type: str, **fields) -> dict:
    return cfg(model_type, DENSE, **fields)


def moe(model_type: str, **fields) -> dict:
    return cfg(model_type, DENSE, EXPERTS, **fields)


def wrapped(model_type: str, text_config: dict) -> dict:
    """A vision-language wrapper around a text model: the text model's config nested."""
    layers = text_config["num_hidden_layers"]
    return cfg(model_type, text_config=text_config, vocab_size=VOCAB, num_hidden_layers=layers)
