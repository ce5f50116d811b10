"""Dense transformers: every layer attention (full, sliding or chunked) then an MLP."""

from __future__ import annotations

from .base import CHUNK, VOCAB, WINDOW, dense, wrapped

FULL, SLIDING = "full_attention", "sliding_attention"
TWO_ROPES = {FULL: {"rope_theta": 1e6}, SLIDING: {"rope_theta": 1e4}}
# Mistral 3's rope: a default rope plus Llama 4's attention-temperature scaling
MISTRAL3_ROPE = {
    "rope_type": "default",
    "rope_theta": 1e4,
    "llama_4_scaling_beta": 0.1,
    "original_max_position_embeddings": 64,
}

GPT_STYLE = {
    "gpt2": dict(
        model_type="gpt2",
        n_ctx=512,
        n_embd=64,
        n_head=4,
        n_layer=2,
        n_positions=512,
        layer_norm_epsilon=1e-5,
        vocab_size=VOCAB,
    ),
    "gpt_bigcode": dict(
        model_type="gpt_bigcode",
        n_embd=64,
        n_layer=2,
        n_inner=128,
        n_head=4,
        n_positions=512,
        layer_norm_epsilon=1e-5,
        vocab_size=VOCAB,
    ),
    "gptj": dict(
        model_type="gptj",
        n_embd=64,
        n_head=4,
        n_layer=2,
        n_positions=512,
        rotary_dim=8,
        layer_norm_epsilon=1e-5,
        vocab_size=VOCAB,
    ),
    "gpt_neox": dense("gpt_neox", layer_norm_eps=1e-5, rotary_emb_base=10000, rotary_pct=0.25),
    "lille-130m": dict(
        model_type="lille-130m",
        block_size=512,
        layer_norm_eps=1e-5,
        n_embd=64,
        n_head=4,
        n_kv_heads=2,
        n_layer=2,
        rope_theta=10000.0,
        vocab_size=VOCAB,
    ),
    "openelm": dict(
        model_type="openelm",
        head_dim=16,
        num_transformer_layers=2,
        model_dim=64,
        vocab_size=VOCAB,
        ffn_dim_divisor=16,
        num_query_heads=[4, 4],
        num_kv_heads=[2, 2],
        ffn_multipliers=[0.5, 1.0],
        normalize_qk_projections=True,
    ),
    "afm7": dict(
        model_type="afm7",
        vocab_size=VOCAB,
        hidden_dim=64,
        num_layers=4,
        num_kv_reuse_layers=2,
        num_heads=4,
        num_kv_heads=2,
    ),
    "exaone": dense("exaone", num_layers=2, layer_norm_epsilon=1e-5),
    "qwen": dense("qwen", kv_channels=16, layer_norm_epsilon=1e-6),
    "phi": dense("phi", layer_norm_eps=1e-5, partial_rotary_factor=0.5),
}

FULL_ATTENTION = {
    "llama": dense("llama"),
    "llama3-rope": dense(
        "llama",
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
    "mistral": dense("mistral"),  # mlx-lm maps it onto llama
    "apertus": dense("apertus", mlp_bias=True, post_norm=True, qk_norm=True),
    "bitnet": dense("bitnet"),
    "cohere": dense("cohere", layer_norm_eps=1e-5, use_qk_norm=True),
    "ernie4_5": dense("ernie4_5", use_bias=False),
    "gemma": dense("gemma"),
    "gemma2": dense(
        "gemma2",
        query_pre_attn_scalar=16,
        attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0,
    ),
    "glm": dense("glm"),
    "glm4": dense("glm4", partial_rotary_factor=0.5),
    "granite": dense(
        "granite",
        logits_scaling=1.0,
        attention_multiplier=1.0,
        embedding_multiplier=1.0,
        residual_multiplier=1.0,
    ),
    "helium": dense("helium"),
    "hunyuan_v1_dense": dense(
        "hunyuan_v1_dense",
        use_qk_norm=True,
        rope_scaling={"alpha": 1000.0, "factor": 1.0, "type": "dynamic"},
    ),
    "internlm2": dense("internlm2"),
    "internlm3": dense("internlm3"),
    "mimo": dense("mimo"),
    "minicpm": dense("minicpm", dim_model_base=64, scale_depth=1.0, scale_emb=1.0),
    "ministral3": dense("ministral3", rope_parameters=MISTRAL3_ROPE),
    "nanbeige": dense("nanbeige"),
    "nanochat": dense("nanochat"),
    "nemotron": dense("nemotron", hidden_act="relu2", norm_eps=1e-5, partial_rotary_factor=0.5),
    "nemotron-nas": dense(
        "nemotron-nas",
        block_configs=[
            {
                "attention": {"n_heads_in_group": 2, "no_op": False, "replace_with_linear": False},
                "ffn": {"ffn_mult": 1.3125, "no_op": False, "replace_with_linear": False},
            }
        ]
        * 2,
    ),
    "olmo2": dense("olmo2"),
    "phi3": dense("phi3"),
    "plamo": dense("plamo", n_shared_head=2),
    "qwen2": dense("qwen2"),
    "qwen3": dense("qwen3"),
    "seed_oss": dense("seed_oss"),
    "smollm3": dense("smollm3", num_hidden_layers=4),  # every 4th layer has no rope
    "stablelm": dense(
        "stablelm", layer_norm_eps=1e-5, partial_rotary_factor=0.25, use_qkv_bias=True
    ),
    "starcoder2": dense("starcoder2", norm_epsilon=1e-5),
    "talkie": dense("talkie"),
    "telechat3": dense("telechat3"),
    "youtu_llm": dense(
        "youtu_llm",
        kv_lora_rank=16,
        q_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=16,
    ),
    "minicpm3": dense(
        "minicpm3",
        dim_model_base=64,
        scale_depth=1.0,
        scale_emb=1.0,
        kv_lora_rank=16,
        q_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        rope_scaling={"original_max_position_embeddings": 512},
    ),
    "qwen2_vl": wrapped("qwen2_vl", dense("qwen2")),
    "qwen3_vl": wrapped("qwen3_vl", dense("qwen3")),
    "pixtral": wrapped("pixtral", dense("llama")),
    "mistral3": wrapped("mistral3", dense("ministral3", rope_parameters=MISTRAL3_ROPE)),
}

LOCAL_ATTENTION = {
    "llama-sliding": dense(
        "llama",
        num_hidden_layers=4,
        sliding_window=WINDOW,
        layer_types=[FULL, SLIDING, SLIDING, FULL],
    ),
    "cohere2": dense(
        "cohere2",
        num_hidden_layers=4,
        sliding_window=WINDOW,
        sliding_window_pattern=2,
        layer_norm_eps=1e-5,
    ),
    "exaone4": dense(
        "exaone4",
        num_hidden_layers=4,
        sliding_window=WINDOW,
        sliding_window_pattern="LLGL",
        rope_scaling=None,
        # as EXAONE 4's own configs do: transformers reads the pattern only as an
        # int, so without these its tokenizer load fails on the config
        layer_types=[SLIDING, SLIDING, FULL, SLIDING],
    ),
    "gemma3_text": dense(
        "gemma3_text", num_hidden_layers=4, sliding_window=WINDOW, sliding_window_pattern=2
    ),
    "gemma3": wrapped(
        "gemma3",
        dense("gemma3_text", num_hidden_layers=4, sliding_window=WINDOW, sliding_window_pattern=2),
    ),
    "gear": dense(
        "gear",
        num_hidden_layers=4,
        sliding_window=WINDOW,
        layer_types=[SLIDING, FULL, SLIDING, FULL],
    ),
    "iquestloopcoder": dense("iquestloopcoder", loop_num=2, loop_window_size=WINDOW),
    "olmo3": dense("olmo3", num_hidden_layers=4, sliding_window=WINDOW),
    "plamo3": dense("plamo3", num_hidden_layers=4, sliding_window=WINDOW, sliding_window_pattern=2),
    "spark2_5": dense(
        "spark2_5", num_hidden_layers=4, sliding_window=WINDOW, rope_parameters=TWO_ROPES
    ),
    "muse_glimmer": dense("muse_glimmer", num_hidden_layers=4, sliding_window=WINDOW),
    "phi3small": dense(
        "phi3small",
        num_hidden_layers=4,
        dense_attention_every_n_layers=2,
        ff_intermediate_size=128,
        gegelu_limit=1.0,
        layer_norm_epsilon=1e-5,
    ),
    "ministral3-sliding": dense(
        "ministral3",
        sliding_window=WINDOW,
        layer_types=[SLIDING, FULL],
        rope_parameters=MISTRAL3_ROPE,
    ),
    "llama4_text": dense(
        "llama4_text",
        num_hidden_layers=4,
        intermediate_size_mlp=128,
        no_rope_layers=[0, 1, 1, 1],
        use_qk_norm=True,
        attention_chunk_size=CHUNK,
    ),
    "gemma4_text": dense(
        "gemma4_text",
        num_hidden_layers=4,
        global_head_dim=32,
        num_key_value_heads=1,
        num_kv_shared_layers=2,
        hidden_size_per_layer_input=16,
        vocab_size_per_layer_input=VOCAB,
        sliding_window=WINDOW,
        final_logit_softcapping=30.0,
        layer_types=[SLIDING, FULL, SLIDING, FULL],
        rope_parameters={
            FULL: {"partial_rotary_factor": 0.25, "rope_theta": 1e6},
            SLIDING: {"rope_theta": 1e4},
        },
    ),
    "gemma4": wrapped(
        "gemma4",
        dense(
            "gemma4_text",
            num_hidden_layers=4,
            global_head_dim=32,
            num_key_value_heads=1,
            num_kv_shared_layers=2,
            hidden_size_per_layer_input=16,
            vocab_size_per_layer_input=VOCAB,
            sliding_window=WINDOW,
            layer_types=[SLIDING, FULL, SLIDING, FULL],
            rope_parameters=TWO_ROPES,
        ),
    ),
    "gemma3n": wrapped(
        "gemma3n",
        dense(
            "gemma3n",
            num_kv_shared_layers=2,
            num_hidden_layers=4,
            vocab_size_per_layer_input=VOCAB,
            sliding_window=WINDOW,
            rope_local_base_freq=1e4,
            final_logit_softcapping=30.0,
            layer_types=[SLIDING, FULL, SLIDING, FULL],
            activation_sparsity_pattern=[0.0] * 4,
            hidden_size_per_layer_input=16,
            altup_num_inputs=2,
            altup_coef_clip=1.0,
            altup_correct_scale=True,
            altup_active_idx=0,
            laurel_rank=8,
        ),
    ),
}

ATTENTION = {**GPT_STYLE, **FULL_ATTENTION, **LOCAL_ATTENTION}
