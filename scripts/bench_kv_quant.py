"""Decode attention over quantized K/V, two ways, on the MLX ops: dequantize what was gathered
then plain matmuls (what worker/attention does), or `mx.quantized_matmul` on the gathered
packed rows. A brief micro-benchmark (the default model's shape: 9 heads, 3 KV heads, head
dim 64; float32 on CPU). quantized_matmul won every row of one run (worker/attention/mlx_ops.py
has the numbers), so the attention uses it.

  OPENBLAS_NUM_THREADS=1 LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
      python scripts/bench_kv_quant.py
"""

from __future__ import annotations

import time

import mlx.core as mx

HEADS, HKV, D = 9, 3, 64


def timed(fn, repeat: int = 20) -> float:
    mx.eval(fn())
    start = time.perf_counter()
    for _ in range(repeat):
        mx.eval(fn())
    return (time.perf_counter() - start) / repeat * 1e3


def case(
    batch: int, ctx: int, bits: int, group: int = 64, queries: int = 1
) -> tuple[float, float, float]:
    keys = mx.random.normal((HKV, batch, ctx, D))
    values = mx.random.normal((HKV, batch, ctx, D))
    kq, vq = mx.quantize(keys, group, bits), mx.quantize(values, group, bits)
    q = mx.random.normal((HKV, batch, HEADS // HKV * queries, D))
    mx.eval(kq, vq, q)

    def plain():
        w = mx.softmax(q @ keys.swapaxes(-1, -2), axis=-1)
        return w @ values

    def dequantized():
        k = mx.dequantize(*kq, group_size=group, bits=bits)
        v = mx.dequantize(*vq, group_size=group, bits=bits)
        w = mx.softmax(q @ k.swapaxes(-1, -2), axis=-1)
        return w @ v

    def quantized():
        s = mx.quantized_matmul(q, *kq, transpose=True, group_size=group, bits=bits)
        w = mx.softmax(s, axis=-1)
        return mx.quantized_matmul(w, *vq, transpose=False, group_size=group, bits=bits)

    assert mx.allclose(quantized(), dequantized(), atol=1e-3).item()
    return timed(plain), timed(dequantized), timed(quantized)


def main() -> None:
    print("case                      bits  plain  dequantize+matmul  quantized_matmul (ms)")
    for batch, ctx in ((1, 1000), (8, 512), (32, 1024)):
        for bits in (8, 4):
            p, d, qm = case(batch, ctx, bits)
            print(f"decode B={batch:<3} ctx {ctx:<5}     {bits}   {p:6.2f}  {d:17.2f}  {qm:16.2f}")
    for bits in (8, 4):  # a prefill chunk (no causal mask here: the matmuls are the point)
        p, d, qm = case(1, 1280, bits, queries=256)
        print(f"prefill Lq=256 ctx 1280  {bits}   {p:6.2f}  {d:17.2f}  {qm:16.2f}")


if __name__ == "__main__":
    main()
