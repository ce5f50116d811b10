"""The gated delta rule over a prompt in chunks: a few matrix products per chunk of tokens
where mlx-lm's CPU reference (`gated_delta_ops`) takes eight small ops per token.

The recurrence (per batch row and value head; state S is Dv x Dk, g a scalar decay):

    S <- g_t S;   d_t = beta_t (v_t - S k_t);   S <- S + d_t k_t^T;   y_t = S q_t

Within a chunk starting from S_0, with c_t = log g_1 + ... + log g_t (so the decay from
token s to token t is e^(c_t - c_s)), the updates d_t satisfy one unit lower-triangular
system, (I + A) D = beta (V - e^c K S_0^T) with A[t, s] = beta_t e^(c_t - c_s) k_t.k_s for
s < t; so D = U - W S_0^T with U = (I + A)^-1 beta V and W = (I + A)^-1 beta e^c K, both
made for every chunk at once. Only the chunk-to-chunk step is sequential:

    Y   = e^c (Q S_0^T) + M D            M[t, s] = e^(c_t - c_s) q_t.k_s for s <= t
    S_C = e^(c_C) S_0 + D^T (e^(c_C - c) K)

A masked (padding) position keeps the state: g = 1 and beta = 0 there. Exact algebra, so
the outputs equal the per-token loop's up to float rounding (the tests compare them).
`tri_inv` runs on MLX's CPU stream only: this is a CPU path (on Apple GPUs mlx-lm's Metal
kernel runs instead). Scalar decay only; a per-key-channel decay keeps the loop.
"""

from __future__ import annotations

import mlx.core as mx

CHUNK = 64  # tokens per chunk: the sequential steps of a T-token prompt are T / CHUNK
MIN_TOKENS = 8  # shorter runs (decode steps) keep the per-token loop: nothing to gain
_LOG_FLOOR = -80.0  # log of a decay that underflowed to 0 (e^-80: nothing of S survives)


def chunked_gated_delta(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    g: mx.array,
    beta: mx.array,
    state: mx.array,
    mask: mx.array | None = None,
    chunk: int = CHUNK,
) -> tuple[mx.array, mx.array]:
    """`gated_delta_ops`' result, in chunks. q, k (B, T, Hk, Dk); v (B, T, Hv, Dv);
    g, beta (B, T, Hv); state (B, Hv, Dv, Dk) float32; mask (B, T), True at real tokens.
    Returns y (B, T, Hv, Dv) in q's dtype and the state after the last token."""
    B, T, Hk, Dk = q.shape
    Hv, Dv = v.shape[-2:]
    if Hv // Hk > 1:
        q, k = mx.repeat(q, Hv // Hk, -2), mx.repeat(k, Hv // Hk, -2)
    if mask is not None:
        g = mx.where(mask[..., None], g, 1.0)
        beta = mx.where(mask[..., None], beta, 0.0)
    n = -(-T // chunk)
    pad = n * chunk - T  # padding past the end keeps the state too (k = 0, beta = 0)

    def chunks(x: mx.array, fill: float = 0.0) -> mx.array:
        """(B, T, H, ...) -> (B, H, n, chunk, ...) in float32."""
        x = x.astype(mx.float32)
        if pad:
            x = mx.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2), constant_values=fill)
        x = x.reshape(B, n, chunk, *x.shape[2:])
        return mx.moveaxis(x, 3, 1)

    qc, kc, vc = chunks(q), chunks(k), chunks(v)
    bc = chunks(beta)[..., None]  # (B, H, n, C, 1)
    c = mx.cumsum(mx.maximum(mx.log(chunks(g, 1.0)), _LOG_FLOOR), axis=-1)  # (B, H, n, C)
    rel = c[..., :, None] - c[..., None, :]  # (B, H, n, C, C): c_t - c_s
    lower = mx.tril(mx.ones((chunk, chunk), dtype=mx.bool_))
    decay = mx.where(lower, mx.exp(mx.where(lower, rel, 0.0)), 0.0)  # s <= t
    strict = decay * (1.0 - mx.eye(chunk))
    a = bc * strict * (kc @ kc.swapaxes(-1, -2))
    inverse = mx.linalg.tri_inv(a + mx.eye(chunk), upper=False, stream=mx.cpu)
    ec = mx.exp(c)[..., None]  # (B, H, n, C, 1)
    u = inverse @ (bc * vc)  # (B, H, n, C, Dv)
    w = inverse @ (bc * ec * kc)  # (B, H, n, C, Dk)
    m = decay * (qc @ kc.swapaxes(-1, -2))  # (B, H, n, C, C)
    qe = ec * qc
    tail = mx.exp(c[..., -1:, None] - c[..., None])  # (B, H, n, C, 1): e^(c_C - c_s)
    kt = tail * kc
    last = mx.exp(c[..., -1])[..., None, None]  # (B, H, n, 1, 1)

    s = state.astype(mx.float32)
    ys = []
    for i in range(n):
        d = u[:, :, i] - w[:, :, i] @ s.swapaxes(-1, -2)  # (B, H, C, Dv)
        ys.append(qe[:, :, i] @ s.swapaxes(-1, -2) + m[:, :, i] @ d)
        s = last[:, :, i] * s + d.swapaxes(-1, -2) @ kt[:, :, i]
    y = mx.concatenate(ys, axis=2)[:, :, :T] if n > 1 else ys[0][:, :, :T]
    return y.swapaxes(1, 2).astype(q.dtype), s
