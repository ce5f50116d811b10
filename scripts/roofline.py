#!/usr/bin/env python3
"""The physical limit of a serving run on this machine, and how close a run came to it.

Measures what the machine can do with MLX (memory read bandwidth, sgemm peak, and the rate at
which a small-batch matmul streams its weights, which is what a decode tick does), counts what
the model must do (weight bytes per forward, FLOPs per token), and for a load generator report
(`scripts/loadgen ... --out FILE`, one JSON object, or JSON lines of several) prints the least
time its token forwards can take, the request rate that bound allows, and the fraction of it the
run achieved, next to the run's own phase metrics. One JSON line per section.

    .venv/bin/python scripts/roofline.py --report bench-results/chat.json
    .venv/bin/python scripts/roofline.py --batch 10 --context 600 --output-tokens 32 \\
        --prompt-tokens 560 --cached-fraction 0.9         # a described load, no run needed

The bound is a floor, not a forecast: every decode tick reads every weight once (plus the K/V
it gathers) at the measured bandwidth, or does its FLOPs at the measured sgemm peak, whichever
is slower; uncached prompt tokens cost their FLOPs at the peak. Time spent elsewhere (Python,
the router, padding, gathers) is what the achieved fraction leaves on the table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from shared.config.choices import DEFAULT_KV_GROUP_SIZE  # noqa: E402

# ------------------------------------------------------------ the model's arithmetic


@dataclass(frozen=True)
class ModelCost:
    """What one token's forward costs a dense decoder, from its config.json."""

    layer_params: int  # attention + MLP weights of all layers (norms included)
    head_params: int  # the output projection (the embedding when tied: read on every forward)
    kv_bytes_per_token: float  # K and V of one token, all layers, at `bytes_per_value`
    bytes_per_weight: float

    @property
    def params(self) -> int:
        return self.layer_params + self.head_params

    @property
    def weight_bytes(self) -> float:
        """Bytes every forward reads, whatever its batch."""
        return self.params * self.bytes_per_weight

    @property
    def flops_per_token(self) -> int:
        return 2 * self.params  # a multiply and an add per weight (attention scores aside)


def model_cost(
    config: dict, bytes_per_weight: float = 4.0, bytes_per_value: float = 4.0
) -> ModelCost:
    """`bytes_per_weight` 4: float32, what the CPU backend computes in; 2 for float16 on a GPU,
    ~0.56 for 4-bit weights with group-32 scales and biases. `bytes_per_value`: one K or V
    value in the pool (4: float32; with --kv-bits, the packed bits plus the group's scale and
    bias: worker.kv.quant.bytes_per_value)."""
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim") or hidden // heads
    ffn = config["intermediate_size"]
    layers = config["num_hidden_layers"]
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2  # q, o; k, v
    mlp = 3 * hidden * ffn  # gate, up, down
    per_layer = attention + mlp + 2 * hidden  # two RMS norms
    head = config["vocab_size"] * hidden + hidden  # + the final norm
    kv = layers * 2 * kv_heads * head_dim * bytes_per_value
    return ModelCost(layers * per_layer, head, kv, bytes_per_weight)


# ------------------------------------------------------------ the machine


@dataclass(frozen=True)
class Machine:
    read_gb_s: float  # a sum over a large float32 array (numpy's: see measure_machine)
    sgemm_gflop_s: float  # a large square float32 matmul
    stream_gb_s: float  # a 10-row matmul's weight bytes per second (a decode tick's shape)

    @property
    def bandwidth_gb_s(self) -> float:
        """The best read rate seen: a bound must not be beaten by a run."""
        return max(self.read_gb_s, self.stream_gb_s)


def _median_seconds(run, repeats: int) -> float:
    import mlx.core as mx

    mx.eval(run())  # warm-up: allocation, first-use paths
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        mx.eval(run())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _median_numpy_seconds(run, repeats: int) -> float:
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_machine(repeats: int = 5, mb: int = 512) -> Machine:
    import mlx.core as mx
    import numpy as np

    # The memory's read rate. numpy's sum, not MLX's: on this machine (mlx 0.32 CPU) MLX's
    # reductions read at ~2.6 GB/s where numpy's single thread reads at ~17 GB/s, and a bound
    # must be what the memory can do, not what one library's reduction does.
    values = np.ones(mb * 2**20 // 4, dtype=np.float32)
    read = values.nbytes / _median_numpy_seconds(values.sum, repeats) / 1e9
    n = 2048
    a, b = mx.random.normal((n, n)), mx.random.normal((n, n))
    sgemm = 2 * n**3 / _median_seconds(lambda: a @ b, repeats) / 1e9
    weights = mx.random.normal((576, mb * 2**20 // 4 // 576 // 2))  # half the array above
    rows = mx.random.normal((10, 576))
    stream = weights.nbytes / _median_seconds(lambda: rows @ weights, repeats) / 1e9
    return Machine(round(read, 2), round(sgemm, 1), round(stream, 2))


# ------------------------------------------------------------ a run's bound


@dataclass(frozen=True)
class Load:
    """What a run asked of the model, in tokens."""

    requests: int
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    decode_batch: float  # mean sequences per decode tick
    kv_bytes_per_tick: float  # K/V one decode tick reads (measured, or described)
    kv_shared_bytes_per_tick: float = 0.0  # ...with each shared prefix read once (measured)


def bound(load: Load, cost: ModelCost, machine: Machine) -> dict:
    """The least time the load's forwards take on `machine`, and the rates that allows."""
    batch = max(load.decode_batch, 1.0)
    ticks = load.output_tokens / batch
    tick_bytes = cost.weight_bytes + load.kv_bytes_per_tick
    by_bandwidth = tick_bytes / (machine.bandwidth_gb_s * 1e9)
    by_flops = cost.flops_per_token * batch / (machine.sgemm_gflop_s * 1e9)
    tick_floor = max(by_bandwidth, by_flops)
    uncached = max(load.prompt_tokens - load.cached_tokens, 0)
    prefill_floor = uncached * cost.flops_per_token / (machine.sgemm_gflop_s * 1e9)
    total = ticks * tick_floor + prefill_floor
    shared = {}
    if load.kv_shared_bytes_per_tick:  # the same bound with every shared prefix read once
        shared_bytes = cost.weight_bytes + load.kv_shared_bytes_per_tick
        shared_floor = max(shared_bytes / (machine.bandwidth_gb_s * 1e9), by_flops)
        shared_total = ticks * shared_floor + prefill_floor
        shared = {
            "kv_shared_mb_per_tick": round(load.kv_shared_bytes_per_tick / 1e6, 2),
            "tick_floor_shared_ms": round(shared_floor * 1e3, 2),
            "bound_shared_requests_per_s": round(load.requests / shared_total, 3),
        }
    return shared | {
        "decode_ticks": round(ticks, 1),
        "kv_mb_per_tick": round(load.kv_bytes_per_tick / 1e6, 2),  # the pool's real bytes
        "tick_floor_ms": round(tick_floor * 1e3, 2),
        "tick_bound_by": "bandwidth" if by_bandwidth >= by_flops else "flops",
        "tick_floor_at_stream_rate_ms": round(tick_bytes / (machine.stream_gb_s * 1e9) * 1e3, 2),
        "prefill_floor_s": round(prefill_floor, 3),
        "floor_s": round(total, 3),
        "bound_requests_per_s": round(load.requests / total, 3) if total > 0 else None,
        "bound_output_tokens_per_s": round(load.output_tokens / total, 1) if total > 0 else None,
    }


def decoding_phases(report: dict) -> list[dict]:
    """The phase metrics of the workers that decoded in the run (not a prefill worker's)."""
    phases = [p for p in (report.get("worker_phases") or {}).values() if p]
    return [p for p in phases if p.get("decode_batch_mean")]


def load_of_report(report: dict, cost: ModelCost) -> Load:
    """The load a loadgen report describes; decode batch and K/V per tick from its workers'
    phase metrics (mean over workers), else the run's concurrency and no K/V."""
    phases = decoding_phases(report)
    batch = statistics.mean(p["decode_batch_mean"] for p in phases) if phases else None
    kv = statistics.mean(p["decode_kv_bytes_mean"] for p in phases) if phases else 0.0
    shared = [p.get("decode_kv_shared_bytes_mean") or 0.0 for p in phases]
    return Load(
        requests=report["completed"],
        prompt_tokens=report.get("prompt_tokens") or 0,
        cached_tokens=report.get("cached_tokens") or 0,
        output_tokens=report["output_tokens"],
        decode_batch=batch or report.get("concurrency") or 1.0,
        kv_bytes_per_tick=kv,
        kv_shared_bytes_per_tick=statistics.mean(shared) if shared else 0.0,
    )


def achieved(report: dict, limits: dict) -> dict:
    """The run's own figures beside the bound: the fraction of it reached, per tick and overall."""
    phases = decoding_phases(report)
    tick_p50 = statistics.mean(p["decode_tick_p50_ms"] for p in phases) if phases else None
    rate = report.get("requests_per_s")
    bound_rate = limits["bound_requests_per_s"]
    shared_rate = limits.get("bound_shared_requests_per_s")
    return {
        "requests_per_s": rate,
        "fraction_of_bound": round(rate / bound_rate, 3) if rate and bound_rate else None,
        "fraction_of_shared_bound": round(rate / shared_rate, 3) if rate and shared_rate else None,
        "decode_tick_p50_ms": tick_p50,
        "tick_fraction": round(limits["tick_floor_ms"] / tick_p50, 3) if tick_p50 else None,
        "phases": phases[0] if len(phases) == 1 else phases,
    }


def read_reports(path: Path) -> list[dict]:
    """One JSON object, a JSON list, or JSON lines (a comparison's runs)."""
    text = path.read_text().strip()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return data if isinstance(data, list) else [data]


def kv_value_bytes(args) -> float:
    """Bytes of one pooled K or V value: the CPU's float32, or as the pool packs --kv-bits
    (a report's K/V per tick needs none of this: the workers measure it in the pool's bytes)."""
    if args.kv_bits is None:
        return 4.0
    import mlx.core as mx

    from worker.kv.quant import bytes_per_value

    return bytes_per_value(mx.float32, args.kv_bits, args.kv_group_size)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="model directory or .gguf (default: the default model)")
    parser.add_argument("--report", type=Path, help="a loadgen report (JSON or JSON lines)")
    parser.add_argument(
        "--bytes-per-weight",
        type=float,
        default=4.0,
        help="4 (float32, the CPU backend), 2 (float16), ~0.56 (4-bit)",
    )
    parser.add_argument("--repeats", type=int, default=5, help="timings per machine figure")
    parser.add_argument("--machine-only", action="store_true", help="print the machine line only")
    described = parser.add_argument_group("a described load (when there is no --report)")
    described.add_argument("--requests", type=int, default=48)
    described.add_argument("--batch", type=float, default=10.0, help="mean decode batch")
    described.add_argument("--context", type=int, default=600, help="mean context per row")
    described.add_argument("--prompt-tokens", type=int, default=560, help="per request")
    described.add_argument("--output-tokens", type=int, default=32, help="per request")
    described.add_argument("--cached-fraction", type=float, default=0.0)
    described.add_argument("--kv-bits", type=int, choices=(4, 8, 16), help="quantized KV pool")
    described.add_argument(
        "--kv-group-size", type=int, default=DEFAULT_KV_GROUP_SIZE, help="with --kv-bits"
    )
    args = parser.parse_args(argv)
    from shared.blas import reexec_with_blas

    reexec_with_blas()  # before MLX loads: the sgemm peak is the workers' BLAS's
    if args.machine_only:
        print(json.dumps(asdict(measure_machine(args.repeats))))
        return 0
    from shared.models.store import read_config, resolve_model

    config = read_config(resolve_model(args.model))
    cost = model_cost(config, args.bytes_per_weight, kv_value_bytes(args))
    machine = measure_machine(args.repeats)
    print(json.dumps({"machine": asdict(machine) | {"bandwidth_gb_s": machine.bandwidth_gb_s}}))
    model = asdict(cost) | {"weight_mb": round(cost.weight_bytes / 1e6, 1)}
    print(json.dumps({"model": model | {"flops_per_token": cost.flops_per_token}}))
    if args.report is None:
        prompt = args.requests * args.prompt_tokens
        load = Load(
            args.requests,
            prompt,
            int(prompt * args.cached_fraction),
            args.requests * args.output_tokens,
            args.batch,
            args.batch * args.context * cost.kv_bytes_per_token,
        )
        print(json.dumps({"load": asdict(load), "bound": bound(load, cost, machine)}))
        return 0
    for report in read_reports(args.report):
        load = load_of_report(report, cost)
        limits = bound(load, cost, machine)
        print(
            json.dumps(
                {
                    "run": report.get("label") or report.get("workload"),
                    "load": asdict(load),
                    "bound": limits,
                    "achieved": achieved(report, limits),
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
