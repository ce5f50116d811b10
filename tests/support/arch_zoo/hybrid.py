"""State-space, linear-attention and recurrent models, alone or interleaved with attention."""

from __future__ import annotations

from .attention import FULL
from .base import DENSE, EXPERTS, GATED_DELTA, LATENT, WINDOW, cfg, dense, moe, wrapped

LINEAR = "linear_attention"
MAMBA = dict(mamba_d_conv=4, mamba_d_state=16, mamba_n_heads=4, mamba_d_head=16,
             mamba_n_groups=1, mamba_proj_bias=False, mamba_conv_bias=True)  # fmt: skip
LFM2 = dict(norm_eps=1e-5, conv_bias=False, conv_L_cache=3, block_dim=64, block_ff_dim=128,
            block_multiple_of=16, block_ffn_dim_multiplier=1.0, block_auto_adjust_ff_dim=False,
            layer_types=[FULL, "conv"])  # fmt: skip

# fmt: off
HYBRID = {
    "mamba": dense("mamba", state_size=16, conv_kernel=4, use_bias=False, use_conv_bias=True,
                   time_step_rank=8),
    "mamba2": dense("mamba2", num_heads=8, head_dim=16, state_size=16, layer_norm_epsilon=1e-5,
                    conv_kernel=3, n_groups=2, use_bias=False, use_conv_bias=True,
                    tie_word_embeddings=True, time_step_limit=(0.01, 10.0), time_step_rank="auto"),
    "falcon_h1": dense("falcon_h1", **MAMBA, mamba_d_ssm=64, mamba_chunk_size=16),
    "jamba": cfg("jamba", DENSE, EXPERTS, num_hidden_layers=4, attn_layer_offset=1,
                 attn_layer_period=2, expert_layer_offset=1, expert_layer_period=2,
                 mamba_d_conv=4, mamba_d_state=16, mamba_expand=2),
    "nemotron_h": dense("nemotron_h", mamba_num_heads=4, mamba_head_dim=16,
                        mamba_proj_bias=False, ssm_state_size=16, conv_kernel=3, n_groups=2,
                        time_step_limit=[0.0, float("inf")], layer_norm_epsilon=1e-5,
                        use_bias=False, use_conv_bias=True, residual_in_fp32=True,
                        hybrid_override_pattern=["*", "M"]),
    "granitemoehybrid": moe("granitemoehybrid", **MAMBA, logits_scaling=1.0,
                            attention_multiplier=1.0, embedding_multiplier=1.0,
                            residual_multiplier=1.0, shared_intermediate_size=32,
                            mamba_expand=1, layer_types=["mamba", "attention"]),
    "lfm2": dense("lfm2", **LFM2),
    "lfm2_moe": moe("lfm2_moe", **LFM2, num_dense_layers=1, use_expert_bias=True),
    "lfm2-vl": wrapped("lfm2-vl", dense("lfm2", **LFM2)),
    "plamo2": dense("plamo2", hidden_size_per_head=16, attention_window_size=512,
                    full_attention_idx=[1], mamba_d_state=16, mamba_d_conv=4, mamba_num_heads=4,
                    mamba_step=2, mamba_chunk_size=16),
    "qwen3_next": moe("qwen3_next", **GATED_DELTA, num_hidden_layers=4, decoder_sparse_step=1,
                      mlp_only_layers=[0], partial_rotary_factor=0.5, full_attention_interval=4),
    "qwen3_5": wrapped("qwen3_5", dense("qwen3_5", **GATED_DELTA, num_hidden_layers=4,
                                        partial_rotary_factor=0.5, full_attention_interval=4)),
    "qwen3_5_moe": wrapped("qwen3_5_moe", moe("qwen3_5_moe", **GATED_DELTA, num_hidden_layers=4,
                                              partial_rotary_factor=0.5,
                                              full_attention_interval=4)),
    "olmo_hybrid": dense("olmo_hybrid", **GATED_DELTA, num_hidden_layers=4,
                         linear_allow_neg_eigval=True),
    "kimi_linear": cfg("kimi_linear", DENSE, EXPERTS, LATENT, num_hidden_layers=4,
                       linear_attn_config={"num_heads": 4, "head_dim": 16, "kda_layers": [1, 3],
                                           "short_conv_kernel_size": 4},
                       model_max_length=512),
    "kimi_k3": wrapped("kimi_k3", cfg("kimi_linear", DENSE, EXPERTS, LATENT,
                                      num_hidden_layers=4, num_experts_per_token=2,
                                      linear_attn_config={"num_heads": 4, "head_dim": 16,
                                                          "kda_layers": [1, 3],
                                                          "short_conv_kernel_size": 4})),
    "bailing_moe_linear": moe("bailing_moe_linear", num_hidden_layers=4, layer_group_size=2,
                              group_norm_size=1, first_k_dense_replace=0),
    "bailing_hybrid": cfg("bailing_hybrid", DENSE, EXPERTS, LATENT, num_hidden_layers=4,
                          layer_group_size=2, group_norm_size=1, first_k_dense_replace=0),
    "bailing_moe_v3": cfg("bailing_moe_v3", DENSE, EXPERTS, LATENT, num_hidden_layers=4,
                          layer_group_size=2, first_k_dense_replace=0),
    "rwkv7": dense("rwkv7", norm_eps=1e-5, a_low_rank_dim=8, v_low_rank_dim=8,
                   gate_low_rank_dim=8, decay_low_rank_dim=8),
    "recurrent_gemma": dense("recurrent_gemma", conv1d_width=3, logits_soft_cap=30.0,
                             attention_window_size=WINDOW, num_hidden_layers=3,
                             block_types=["recurrent", "recurrent", "attention"]),
    "baichuan_m1": dense("baichuan_m1", sliding_window=WINDOW, sliding_window_layers=[0],
                         conv_window=2),
}
# fmt: on
