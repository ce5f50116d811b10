"""Prompt tokens that partial-block reuse (copy-on-write) saves, on a loadgen workload's shape.

Counts tokens, times nothing: the workload's prompts (scripts/loadgen/workloads.py) through
the default model's chat template and tokenizer, replayed through the engine over a tiny random
model (same vocabulary), closed loop at a fixed concurrency, once with partial reuse and once
without. Prints, per run, the prompt tokens, the full-block cache hits, the partial hits and the
prompt tokens computed.

    PYTHONPATH=$PWD python scripts/replay_partial_reuse.py [--workload multi_tenant] [-n 48]
"""

from __future__ import annotations

import argparse
import glob
import os

import mlx.core as mx
from mlx_lm.models import llama
from transformers import AutoTokenizer

from scripts.loadgen.workloads import WORKLOADS, Shape
from shared.sampling import SamplingParams
from worker.config import EngineConfig
from worker.engine.engine import Engine
from worker.engine.step_kind import REFERENCE_COSTS

TOKENIZER_GLOB = "~/.cache/mlx-fleet/models/SmolLM2-135M-Instruct*/tokenizer.json"


def prompts(workload: str, n: int, seed: int) -> list[list[int]]:
    path = sorted(glob.glob(os.path.expanduser(TOKENIZER_GLOB)))[0]
    tokenizer = AutoTokenizer.from_pretrained(os.path.dirname(path))
    texts = [
        tokenizer.apply_chat_template(p.messages, add_generation_prompt=True, tokenize=False)
        for p in WORKLOADS[workload](n, seed, Shape())
    ]
    return [tokenizer.encode(text, add_special_tokens=False) for text in texts]


def tiny_model(vocab_size: int) -> llama.Model:
    mx.random.seed(0)
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=vocab_size,
        tie_word_embeddings=True,
    )
    model = llama.Model(args)
    mx.eval(model.parameters())
    return model


def replay(model, token_lists: list[list[int]], partial: bool, args) -> dict:
    config = EngineConfig(block_size=args.block_size, num_blocks=args.num_blocks, warmup=False)
    engine = Engine.create(model, config, max_context=4096, costs=REFERENCE_COSTS)
    if not partial:
        engine.cache.partials.match = lambda *_: None
    sampling = SamplingParams(max_tokens=args.max_tokens)
    queue, running = list(enumerate(token_lists)), 0
    while queue or engine.has_work():
        while queue and running < args.concurrency:
            i, tokens = queue.pop(0)
            engine.add_request(f"r{i}", tokens, sampling)
            running += 1
        running -= sum(1 for d in engine.step() if d.finish_reason is not None)
    engine.check_integrity()
    stats = engine.stats()
    total = sum(len(t) for t in token_lists)
    full, part = stats["cache_hit_tokens"], stats["partial_hit_tokens"]
    return dict(prompt=total, full_hits=full, partial_hits=part, computed=total - full - part)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="multi_tenant", choices=sorted(WORKLOADS))
    parser.add_argument("-n", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--num-blocks", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    token_lists = prompts(args.workload, args.n, args.seed)
    model = tiny_model(49152)
    for partial in (False, True):
        r = replay(model, token_lists, partial, args)
        print(
            f"{args.workload} n={args.n} c={args.concurrency} partial={'on ' if partial else 'off'}"
            f" prompt={r['prompt']} full_hits={r['full_hits']} partial_hits={r['partial_hits']}"
            f" computed={r['computed']} ({r['partial_hits'] / args.n:.1f} tokens/request saved)"
        )


if __name__ == "__main__":
    main()
