#!/usr/bin/env python
"""Hybrid models (recurrent layers beside attention) in one process: our engine against
mlx-lm, and prefix hits from state snapshots against none.

Model: a Qwen3-Next-shaped one (gated-delta linear attention on three layers of four, full
attention on the fourth, a mixture of experts), random weights, sized so a forward is not
trivial. Measured:

  - throughput: generated tokens/s (prefill included) of mlx-lm's own `batch_generate` and of
    our engine on the same model object and prompts, at each batch size; medians of
    `--repeats` runs, the ratio, and whether greedy outputs agree;
  - multi-turn: `--conversations` chats of `--turns` turns sent together turn by turn (a
    shared system prompt, then each turn the previous prompt, its reply and a new message),
    with snapshots (the default) and without (`EngineConfig.state_snapshots=0`): median TTFT
    of the turns after the first, prompt tokens served from cache, and the snapshots' count
    and bytes at the end.

Prints one JSON line per measurement.   Usage: scripts/bench_hybrid.py [--help]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.bench_windows import bench_throughput  # noqa: E402  (the same runs)
from shared.blas import active_blas, reexec_with_blas  # noqa: E402

VOCAB = 49152  # the default model's tokenizer drives mlx-lm's batch_generate

QWEN3_NEXT = dict(
    model_type="qwen3_next",
    hidden_size=512,
    num_hidden_layers=8,
    intermediate_size=1024,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=64,
    rms_norm_eps=1e-6,
    vocab_size=VOCAB,
    max_position_embeddings=8192,
    rope_theta=1e6,
    partial_rotary_factor=0.25,
    tie_word_embeddings=False,
    attention_bias=False,
    full_attention_interval=4,
    linear_num_value_heads=8,
    linear_num_key_heads=4,
    linear_key_head_dim=64,
    linear_value_head_dim=64,
    linear_conv_kernel_dim=4,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=256,
    shared_expert_intermediate_size=256,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    norm_topk_prob=True,
)


def build():
    import mlx.core as mx
    from mlx_lm.models import qwen3_next

    mx.random.seed(0)
    model = qwen3_next.Model(qwen3_next.ModelArgs.from_dict(QWEN3_NEXT))
    mx.eval(model.parameters())
    return model


def words(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100, VOCAB) for _ in range(n)]


def chat(model, args, snapshots: int | None) -> dict:
    """The multi-turn load on a fresh engine; TTFT per turn and cached tokens."""
    import gc

    import mlx.core as mx

    from shared.sampling import SamplingParams
    from worker.config import EngineConfig
    from worker.engine.engine import Engine

    gc.collect()
    mx.clear_cache()
    engine = Engine.create(
        model,
        EngineConfig(
            kv_memory_bytes=1 << 30,
            max_running=args.conversations,
            state_snapshots=snapshots,
            speculative="off",
        ),
        max_context=8192,
    )
    rng = random.Random(5)
    system = words(rng, args.system_tokens)
    history = [system + words(rng, args.message_tokens) for _ in range(args.conversations)]
    ttft: dict[int, list[float]] = {}
    cached = prompt = 0
    for turn in range(args.turns):
        start = time.perf_counter()
        params = SamplingParams(max_tokens=args.reply_tokens)
        for i, conversation in enumerate(history):
            engine.add_request(str(i), conversation, params)
        replies: dict[int, list[int]] = {i: [] for i in range(len(history))}
        while engine.has_work():
            for d in engine.step():
                i = int(d.request_id)
                if not replies[i] and d.token_ids:
                    ttft.setdefault(turn, []).append(time.perf_counter() - start)
                replies[i] += d.token_ids
                if d.usage is not None and turn > 0:
                    cached += d.usage.cached_tokens
                    prompt += d.usage.prompt_tokens
        history = [h + replies[i] + words(rng, args.message_tokens) for i, h in enumerate(history)]
    later = [t for turn, ts in ttft.items() if turn > 0 for t in ts]
    pool = engine.states.pool
    return {
        "ttft_first_turn_s": round(statistics.median(ttft[0]), 3),
        "ttft_later_turns_s": round(statistics.median(later), 3),
        "cached_tokens_later_turns": cached,
        "prompt_tokens_later_turns": prompt,
        "snapshots": len(pool.snapshots),
        "snapshot_mib": round(pool.snapshot_bytes / 2**20, 1),
        "state_mib_per_sequence": round(pool.bytes_per_slot / 2**20, 2),
    }


def bench_chat(model, args) -> None:
    runs = {"with": [], "without": []}
    for _ in range(args.repeats):
        runs["with"].append(chat(model, args, None))
        runs["without"].append(chat(model, args, 0))
    med = {k: {f: statistics.median(r[f] for r in v) for f in v[0]} for k, v in runs.items()}
    print(
        json.dumps(
            {
                "bench": "multi_turn",
                "model": "qwen3_next",
                "conversations": args.conversations,
                "turns": args.turns,
                "repeats": args.repeats,
                "with_snapshots": med["with"],
                "without_snapshots": med["without"],
                "ttft_ratio_later_turns": round(
                    med["without"]["ttft_later_turns_s"] / med["with"]["ttft_later_turns_s"], 2
                ),
            }
        ),
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[8, 32]
    )
    parser.add_argument("--prompt-tokens", type=int, default=96)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--system-tokens", type=int, default=400)
    parser.add_argument("--message-tokens", type=int, default=40)
    parser.add_argument("--reply-tokens", type=int, default=24)
    parser.add_argument("--skip", choices=["throughput", "chat"], action="append", default=[])
    args = parser.parse_args()
    reexec_with_blas()

    from shared.models.loading import load_model
    from shared.models.store import resolve_model

    _, tokenizer = load_model(resolve_model(None))
    print(json.dumps({"bench": "setup", "blas": active_blas()}), flush=True)
    model = build()
    if "chat" not in args.skip:
        bench_chat(model, args)
    if "throughput" not in args.skip:
        bench_throughput("qwen3_next", model, tokenizer, args)


if __name__ == "__main__":
    main()
