"""The Metal paged-attention kernel's quantized variant (`--kv-bits 8|4`): the same kernel
(`worker.attention.metal.source`), reading K/V blocks in MLX's affine format and dequantizing
in registers.

A quantized pool (`worker.kv.quant.QuantizedKV`, known here by its `packed` array) is three
arrays per K and V, as `mx.quantize` lays out `(slots, Hkv, D)` along head_dim: packed uint32
values `(slots, Hkv, D * BITS / 32)` (value i of a row in word i / (32 / BITS), bits
(i % (32 / BITS)) * BITS upwards), and a scale and a bias per QUANT_GROUP values
`(slots, Hkv, D / QUANT_GROUP)` in the compute dtype; value = q * scale + bias. Element e of
the pool viewed flat sits in word e / PER_WORD and group e / QUANT_GROUP, so the body indexes
exactly as the unquantized one does, with one load swapped:

- keys: lane t still scores token t of a block, but walks its key word by word, each value
  dequantized once and used by all GROUP query heads (the unquantized body reads the key
  GROUP times from cache; here that would also unpack it GROUP times);
- values: lane l still accumulates elements l, l + 32, ...; 32 / BITS adjacent lanes share a
  word, so a simdgroup's read is 32 * BITS / 8 contiguous bytes plus a scale and bias each.

Per token and KV head the kernel reads D * BITS / 8 bytes and 2 * D / QUANT_GROUP scales and
biases instead of D * itemsize: 2-3.6x less at 8 bits, 3.6-6.4x less at 4 bits (float16).
"""

from __future__ import annotations

from worker.attention.metal import source as metal_source

KERNEL_NAME = "paged_attention_decode_quantized"
INPUT_NAMES = [
    "queries",
    *("k_packed", "k_scales", "k_biases", "v_packed", "v_scales", "v_biases"),
    "block_tables",
    "context_lengths",
    "scale",
]
SUPPORTED_BITS = (8, 4)
SUPPORTED_GROUP_SIZES = (32, 64, 128)

_CONSTANTS = """
    constexpr int PER_WORD = 32 / BITS;  // quantized values per packed uint32
    constexpr uint MASK = (1u << BITS) - 1u;
"""
_KEYS = """
            for (int g = 0; g < GROUP; ++g) {
                float qk = 0.0f;
                for (int d = 0; d < HEAD_DIM; ++d) {
                    qk += q_tile[g * HEAD_DIM + d] * float(k_pool[key_at + d]);
                }
                score[g] = qk;
            }
"""
_QUANTIZED_KEYS = """
            // Each key value is unpacked once and serves all GROUP query heads.
            for (int g = 0; g < GROUP; ++g) {
                score[g] = 0.0f;
            }
            for (int w = 0; w < HEAD_DIM / PER_WORD; ++w) {
                const uint word = k_packed[key_at / PER_WORD + w];
                const int64_t at_group = (key_at + w * PER_WORD) / QUANT_GROUP;
                const float k_scale = float(k_scales[at_group]);
                const float k_bias = float(k_biases[at_group]);
                for (int i = 0; i < PER_WORD; ++i) {
                    const float k = float((word >> (i * BITS)) & MASK) * k_scale + k_bias;
                    for (int g = 0; g < GROUP; ++g) {
                        score[g] += q_tile[g * HEAD_DIM + w * PER_WORD + i] * k;
                    }
                }
            }
"""
_VALUE = "                const float v = float(v_pool[value_at + j * 32 + lane]);\n"
_QUANTIZED_VALUE = """
                const int64_t e = value_at + j * 32 + lane;
                const uint q = (v_packed[e / PER_WORD] >> (uint(e % PER_WORD) * BITS)) & MASK;
                const float v = float(q) * float(v_scales[e / QUANT_GROUP])
                    + float(v_biases[e / QUANT_GROUP]);
"""
_PER_LANE = "    constexpr int PER_LANE = HEAD_DIM / 32;  // head-dim elements a lane accumulates\n"


def _quantized_body(body: str) -> str:
    """The unquantized body with its K and V loads swapped; each edit must apply exactly once
    (an edit of the unquantized body that moves them fails here, at import, not on a Mac)."""
    edits = [
        ("k_pool_shape[1]", "k_packed_shape[1]"),
        (_PER_LANE, _PER_LANE + _CONSTANTS.lstrip("\n")),
        (_KEYS, _QUANTIZED_KEYS),
        (_VALUE, _QUANTIZED_VALUE.lstrip("\n")),
    ]
    for old, new in edits:
        if body.count(old) != 1:
            raise AssertionError(f"the kernel body no longer has exactly one {old.strip()!r}")
        body = body.replace(old, new)
    return body


KERNEL_BODY = _quantized_body(metal_source.KERNEL_BODY)


def is_quantized(pool) -> bool:
    return hasattr(pool, "packed")


def unsupported_reason(pool, *, head_dim: int) -> str | None:
    """Why the quantized variant can't read this pool's layout, or None."""
    if pool.bits not in SUPPORTED_BITS:
        return f"--kv-bits {pool.bits} (kernel: {SUPPORTED_BITS})"
    if pool.group_size not in SUPPORTED_GROUP_SIZES or head_dim % pool.group_size:
        return f"--kv-group-size {pool.group_size} at head_dim {head_dim}"
    return None


def make_launch(queries, k_pool, v_pool, block_tables, context_lengths, *, scale, block_size):
    """The launch of one call over quantized pools: the unquantized launch's grid and
    template, with the pools' three arrays each as inputs and BITS, QUANT_GROUP added."""
    reason = unsupported_reason(k_pool, head_dim=queries.shape[-1])
    if reason is not None:
        raise NotImplementedError(f"the Metal paged-attention kernel does not serve {reason}")
    launch = metal_source.make_launch(
        queries,
        k_pool,
        v_pool,
        block_tables,
        context_lengths,
        scale=scale,
        block_size=block_size,
    )
    queries_in, _, _, *rest = launch.inputs
    return launch._replace(
        inputs=[queries_in, *k_pool.arrays(), *v_pool.arrays(), *rest],
        template=[*launch.template, ("BITS", k_pool.bits), ("QUANT_GROUP", k_pool.group_size)],
    )
