"""Gemma 3 (text) GGUF -> an mlx-lm `gemma3_text` model directory.

The weights are dequantized (K-quants have no MLX equivalent: Q6_K's 16-value groups are
below MLX's smallest group of 32) and saved as bfloat16, Gemma's own dtype: float16
overflows Gemma's residual stream, which is why mlx-lm clips it there. `load_model` then
computes in float32 on CPU and keeps bfloat16 on Metal.

Two facts of llama.cpp's converter (convert_hf_to_gguf.py, Gemma3Model) are undone here:
- It stores every RMSNorm weight plus one (llama.cpp multiplies by the weight, Gemma by
  1 + weight), and mlx-lm's Gemma RMSNorm adds the one itself: we subtract it.
  transformers' GGUF loader does the same for gemma3 (Gemma2TensorProcessor).
- It writes no sliding-window pattern, rope base of the local layers or attention scale:
  llama.cpp hard-codes them for gemma3 (every 6th layer global, local base 10000, scale
  1/sqrt(head_dim) except 27B's 1/sqrt(hidden/heads)), and so do we.
Q and K are not permuted for gemma (only the llama architecture is), so RoPE stays non-
interleaved as mlx-lm's gemma3_text has it.
"""

from __future__ import annotations

import re
from pathlib import Path

from shared.models.gguf.dequantize import dequantized_tensors
from shared.models.gguf.errors import GGUFError
from shared.models.gguf.header import GGUFHeader

ARCH = "gemma3"
SLIDING_WINDOW_PATTERN = 6  # llama.cpp: hparams.set_swa_pattern(6) for LLM_ARCH_GEMMA3
LOCAL_ROPE_BASE = 10_000.0  # llama.cpp: rope_freq_base_train_swa for gemma3
BLOCKS_OF_27B = 62  # the one size llama.cpp scales queries by hidden/heads, not head_dim
END_OF_TURN = "<end_of_turn>"

# Gemma's documented turn format (ai.google.dev/gemma/docs/core/prompt-structure), as in
# the instruction-tuned models' template: a system message is prefixed to the first user
# turn, "assistant" is spelled "model". The base model's GGUF carries no template.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = '' -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.weight$")


def gemma3_tensor_name(gguf_name: str) -> str:
    """`blk.3.post_ffw_norm.weight` -> `model.layers.3.post_feedforward_layernorm.weight`."""
    if (m := _BLOCK_RE.match(gguf_name)) and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.weight"
    base = gguf_name.removesuffix(".weight")
    if base in _GLOBAL_NAMES and gguf_name.endswith(".weight"):
        return f"{_GLOBAL_NAMES[base]}.weight"
    raise GGUFError(f"unsupported gemma3 tensor {gguf_name!r}")


def is_norm(gguf_name: str) -> bool:
    return gguf_name.endswith("norm.weight")


def _get(meta: dict, key: str, default=None):
    value = meta.get(f"{ARCH}.{key}", default)
    if value is None:
        raise GGUFError(f"GGUF metadata lacks {ARCH}.{key!r}")
    return value


def _f32(value) -> float:
    """A float32 field as the decimal it was written from (9.99999997e-07 -> 1e-06)."""
    return float(f"{float(value):.7g}")


def gemma3_config(meta: dict, tensor_names: set[str]) -> dict:
    """The mlx-lm `config.json` (model_type gemma3_text) for a gemma3 GGUF."""
    tokens = meta["tokenizer.ggml.tokens"]
    hidden, heads = int(_get(meta, "embedding_length")), int(_get(meta, "attention.head_count"))
    head_dim, blocks = int(_get(meta, "attention.key_length")), int(_get(meta, "block_count"))
    eos = [int(meta.get("tokenizer.ggml.eos_token_id", 1))]
    if END_OF_TURN in tokens:
        eos.append(tokens.index(END_OF_TURN))
    config = {
        "model_type": "gemma3_text",
        "hidden_size": hidden,
        "num_hidden_layers": blocks,
        "intermediate_size": int(_get(meta, "feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_get(meta, "attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rms_norm_eps": _f32(_get(meta, "attention.layer_norm_rms_epsilon")),
        "vocab_size": len(tokens),
        "rope_theta": _f32(_get(meta, "rope.freq_base")),
        "rope_local_base_freq": LOCAL_ROPE_BASE,
        "query_pre_attn_scalar": hidden // heads if blocks == BLOCKS_OF_27B else head_dim,
        "sliding_window": int(_get(meta, "attention.sliding_window")),
        "sliding_window_pattern": SLIDING_WINDOW_PATTERN,
        "max_position_embeddings": int(_get(meta, "context_length")),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "bos_token_id": int(meta.get("tokenizer.ggml.bos_token_id", 2)),
        "eos_token_id": eos,
    }
    if (scaling := meta.get(f"{ARCH}.rope.scaling.type", "none")) != "none":
        factor = _f32(_get(meta, "rope.scaling.factor"))
        config["rope_scaling"] = {"type": scaling, "rope_type": scaling, "factor": factor}
    return config


def gemma3_weights(path: Path, header: GGUFHeader) -> dict:
    """mlx-lm parameter name -> bfloat16 `mx.array`, norms shifted back by one."""
    import mlx.core as mx

    weights = {}
    for name, values in dequantized_tensors(path, header):
        if is_norm(name):
            values = values - 1.0
        weights[gemma3_tensor_name(name)] = mx.array(values).astype(mx.bfloat16)
        mx.eval(weights[gemma3_tensor_name(name)])  # drop the float32 copy now
    return weights
