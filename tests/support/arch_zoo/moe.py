"""Mixtures of experts, most with multi-head latent attention or local attention layers."""

from __future__ import annotations

from .attention import FULL, MISTRAL3_ROPE, SLIDING, TWO_ROPES
from .base import CHUNK, EXPERTS, LATENT, VOCAB, WINDOW, cfg, dense, moe, wrapped

YARN = {
    "type": "yarn",
    "factor": 4.0,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "original_max_position_embeddings": 128,
}


def latent(model_type: str, **fields) -> dict:
    """DeepSeek-style: experts behind multi-head latent attention."""
    return cfg(model_type, dense(model_type), EXPERTS, LATENT, **fields)


FULL_ATTENTION = {
    "mixtral": moe("mixtral"),
    "qwen2_moe": moe("qwen2_moe"),
    "qwen3_moe": moe("qwen3_moe", decoder_sparse_step=1, mlp_only_layers=[]),
    "qwen3_vl_moe": wrapped(
        "qwen3_vl_moe", moe("qwen3_moe", decoder_sparse_step=1, mlp_only_layers=[])
    ),
    "olmoe": moe("olmoe"),
    "granitemoe": moe(
        "granitemoe",
        logits_scaling=1.0,
        attention_multiplier=1.0,
        embedding_multiplier=1.0,
        residual_multiplier=1.0,
    ),
    "phimoe": moe("phimoe"),
    "phixtral": dict(
        model_type="phixtral",
        num_vocab=VOCAB,
        model_dim=64,
        num_heads=4,
        num_layers=2,
        rotary_dim=8,
        num_experts_per_tok=2,
        num_local_experts=4,
    ),
    "dbrx": dict(
        model_type="dbrx",
        d_model=64,
        n_layers=2,
        n_heads=4,
        vocab_size=VOCAB,
        ffn_config={"ffn_hidden_size": 64, "moe_num_experts": 4, "moe_top_k": 2},
        attn_config={"kv_n_heads": 2, "clip_qkv": 8.0, "rope_theta": 10000},
    ),
    "Klear": moe("Klear", mlp_only_layers=[0], decoder_sparse_step=1),
    "bailing_moe": moe("bailing_moe"),
    "dots1": moe("dots1"),
    "ernie4_5_moe": moe(
        "ernie4_5_moe", use_bias=False, moe_num_experts=4, moe_k=2, moe_intermediate_size=32
    ),
    "glm4_moe": moe("glm4_moe", use_qk_norm=True, partial_rotary_factor=0.5, rope_scaling=None),
    "solar_open": moe("solar_open", partial_rotary_factor=1.0),
    "hunyuan": moe(
        "hunyuan",
        moe_topk=2,
        num_shared_expert=1,
        use_mixed_mlp_moe=True,
        use_qk_norm=True,
        use_cla=True,
        cla_share_factor=2,
        rope_scaling={"alpha": 1000.0, "factor": 1.0, "type": "dynamic"},
    ),
    "minimax": moe("minimax", shared_intermediate_size=32, rotary_dim=8),
    "llama4": wrapped(
        "llama4",
        moe(
            "llama4",
            num_hidden_layers=4,
            intermediate_size_mlp=128,
            interleave_moe_layer_step=2,
            use_qk_norm=True,
            attention_chunk_size=CHUNK,
            num_experts_per_tok=1,
            rope_scaling=None,
            floor_scale=CHUNK,
            attn_scale=4.0,
        ),
    ),
    "deepseek": moe("deepseek"),
    "deepseek_v2": latent("deepseek_v2", rope_scaling=YARN),
    "deepseek_v3": latent("deepseek_v3", rope_scaling=YARN),
    "kimi_k25": wrapped("kimi_k25", latent("deepseek_v3")),
    "kimi_vl": wrapped("kimi_vl", latent("deepseek_v3")),
    "deepseek_v32": latent("deepseek_v32", index_n_heads=2, index_head_dim=16, index_topk=4),
    "glm_moe_dsa": latent(
        "glm_moe_dsa",
        index_n_heads=2,
        index_head_dim=16,
        index_topk=4,
        topk_method="noaux_tc",
        scoring_func="sigmoid",
        moe_layer_freq=1,
        rope_parameters={"rope_theta": 10000.0, "type": "default"},
    ),
    "glm4_moe_lite": latent(
        "glm4_moe_lite",
        topk_method="noaux_tc",
        scoring_func="sigmoid",
        moe_layer_freq=1,
        partial_rotary_factor=1.0,
    ),
    "mistral4": latent("mistral4", rope_parameters=MISTRAL3_ROPE),
    "longcat_flash": latent(
        "longcat_flash",
        attention_method="MLA",
        zero_expert_type="identity",
        ffn_hidden_size=64,
        moe_topk=2,
        expert_ffn_hidden_size=32,
        zero_expert_num=2,
        num_layers=2,
        mla_scale_q_lora=True,
        mla_scale_kv_lora=True,
    ),
    "longcat_flash_ngram": latent(
        "longcat_flash_ngram",
        attention_method="MLA",
        zero_expert_type="identity",
        ffn_hidden_size=64,
        moe_topk=2,
        expert_ffn_hidden_size=32,
        zero_expert_num=2,
        num_layers=2,
        mla_scale_q_lora=True,
        mla_scale_kv_lora=True,
    ),
    "minimax_m3_vl": wrapped(
        "minimax_m3_vl",
        moe(
            "minimax_m3",
            dense_intermediate_size=64,
            shared_intermediate_size=32,
            intermediate_size=32,
        ),
    ),
}

LOCAL_ATTENTION = {
    "gpt_oss": moe("gpt_oss", sliding_window=WINDOW, layer_types=[SLIDING, FULL]),
    "afmoe": moe(
        "afmoe",
        num_hidden_layers=4,
        sliding_window=WINDOW,
        num_dense_layers=1,
        layer_types=[FULL, SLIDING, SLIDING, FULL],
    ),
    "exaone_moe": moe(
        "exaone_moe",
        num_hidden_layers=4,
        sliding_window=WINDOW,
        layer_types=[SLIDING, SLIDING, SLIDING, FULL],
        is_moe_layer=[False, True, True, True],
    ),
    "mellum": moe(
        "mellum", sliding_window=WINDOW, layer_types=[SLIDING, FULL], rope_parameters=TWO_ROPES
    ),
    "laguna": moe(
        "laguna",
        num_hidden_layers=4,
        sliding_window=WINDOW,
        partial_rotary_factor=0.5,
        layer_types=[FULL, SLIDING, SLIDING, SLIDING],
        mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
    ),
    "step3p5": moe(
        "step3p5",
        num_hidden_layers=4,
        num_attention_groups=2,
        sliding_window=WINDOW,
        layer_types=[FULL, SLIDING, SLIDING, FULL],
        rope_theta=[1e4] * 4,
        partial_rotary_factors=[0.5, 1.0, 1.0, 0.5],
        attention_other_setting={"num_attention_heads": 4, "num_attention_groups": 2},
        use_head_wise_attn_gate=True,
        moe_num_experts=4,
        moe_top_k=2,
        share_expert_dim=32,
        moe_layers_enum="1,2,3",
    ),
    "mimo_v2_flash": moe(
        "mimo_v2_flash",
        hybrid_layer_pattern=[0, 1],
        moe_layer_freq=[0, 1],
        add_swa_attention_sink_bias=True,
        add_full_attention_sink_bias=False,
        sliding_window_size=WINDOW,
        topk_method="noaux_tc",
        scoring_func="sigmoid",
        layernorm_epsilon=1e-5,
        swa_rope_theta=1e4,
        swa_num_attention_heads=4,
        swa_num_key_value_heads=2,
        v_head_dim=16,
        swa_head_dim=16,
        swa_v_head_dim=16,
        partial_rotary_factor=0.5,
    ),
    "muse_spark": wrapped(
        "muse_spark",
        moe(
            "muse_spark",
            post_norm_eps=1e-8,
            rope_parameters={"rope_theta": 1e4},
            layer_rope_theta=[1e4, 0.0],
            layer_types=[SLIDING, FULL],
            sliding_window=WINDOW,
            final_logit_softcapping=20.0,
            output_multiplier=0.2,
            moe_hidden_size=32,
            num_shared_experts=0,
            mlp_layer_types=["sparse", "sparse"],
        ),
    )
    # transformers checks, on the tokenizer's load, that the audio encoder fits
    # the text (mlx-lm reads no audio_config; a vision_config would build a tower)
    | {"audio_config": {"out_hidden_size": 64}},
    "deepseek_v41": moe(
        "deepseek_v41",
        head_dim=16,
        q_lora_rank=16,
        qk_rope_head_dim=8,
        o_groups=2,
        o_lora_rank=16,
        sliding_window=WINDOW,
        index_n_heads=2,
        index_head_dim=16,
        index_topk=4,
        hc_mult=2,
        candidate_topk_blocks=4,
    ),
}

MOE = {**FULL_ATTENTION, **LOCAL_ATTENTION}
