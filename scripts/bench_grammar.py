#!/usr/bin/env python
"""Batch throughput with a share of the requests grammar-constrained, vs none, in one run.

The default model, one engine per configuration, the same chat prompts: N requests decoded
to completion (max_tokens each, EOS ignored so every configuration decodes the same number
of tokens), with 0, then a quarter, then all of them carrying a json_schema grammar, and
a quarter carrying penalties + logit_bias instead. Prints one JSON line per configuration:
generated tokens/s, its ratio to the unconstrained run, and the host time spent filling
grammar masks per constrained step.   Usage: scripts/bench_grammar.py [--help]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shared.blas import blas_active, reexec_with_blas  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "mood": {"enum": ["calm", "busy", "dark", "bright"]},
        "rating": {"type": "integer"},
    },
    "required": ["title", "tags", "mood", "rating"],
}


def params_for(kind: str, max_tokens: int):
    from shared.sampling import Grammar, LogitBias, SamplingParams

    if kind == "grammar":
        grammar = Grammar("json_schema", json.dumps(SCHEMA))
        return SamplingParams(max_tokens=max_tokens, grammar=grammar)
    if kind == "penalties":
        return SamplingParams(
            max_tokens=max_tokens,
            presence_penalty=0.5,
            frequency_penalty=0.5,
            repetition_penalty=1.1,
            logit_bias=(LogitBias(30, -5.0),),
        )
    return SamplingParams(max_tokens=max_tokens)


def run(model, grammars, prompts, kinds, max_tokens) -> dict:
    from worker.config import EngineConfig
    from worker.engine.engine import Engine

    # a small pool: one engine per configuration, and MLX keeps freed buffers cached
    config = EngineConfig(kv_memory_bytes=256 * 2**20)
    engine = Engine.create(model, config, max_context=8192, grammars=grammars)
    mask_time = [0.0, 0]
    fill = grammars.fill_masks

    def timed_fill(matchers):
        start = time.perf_counter()
        try:
            return fill(matchers)
        finally:
            mask_time[0] += time.perf_counter() - start
            mask_time[1] += 1

    grammars.fill_masks = timed_fill
    tokens = 0
    start = time.perf_counter()
    for i, (prompt, kind) in enumerate(zip(prompts, kinds, strict=True)):
        engine.add_request(str(i), prompt, params_for(kind, max_tokens))
    while engine.has_work():
        tokens += sum(len(d.token_ids) for d in engine.step())
    elapsed = time.perf_counter() - start
    grammars.fill_masks = fill
    del engine
    import mlx.core as mx

    mx.clear_cache()
    steps = mask_time[1]
    return {
        "tokens": tokens,
        "seconds": round(elapsed, 2),
        "tokens_per_s": round(tokens / elapsed, 1),
        "mask_ms_per_step": round(mask_time[0] / steps * 1e3, 3) if steps else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    if not blas_active():
        reexec_with_blas()
    from scripts.bench_engine import chat_prompts
    from shared.models.loading import load_model
    from shared.models.store import resolve_model
    from worker.runner.grammar import GrammarCompiler
    from worker.runner.model_support import probe_shape

    model, tokenizer = load_model(resolve_model(None))
    grammars = GrammarCompiler.from_hf_tokenizer(tokenizer, probe_shape(model).vocab_size)
    prompts = chat_prompts(tokenizer, args.requests)
    quarter = args.requests // 4
    configs = {
        "none": ["plain"] * args.requests,
        "quarter_grammar": ["grammar"] * quarter + ["plain"] * (args.requests - quarter),
        "all_grammar": ["grammar"] * args.requests,
        "quarter_penalties": ["penalties"] * quarter + ["plain"] * (args.requests - quarter),
    }
    configs["none_again"] = configs["none"]  # the baseline twice: the run's noise
    run(model, grammars, prompts, configs["quarter_grammar"], 4)  # warm: this batch's shapes
    baseline = None
    for name, kinds in configs.items():
        result = run(model, grammars, prompts, kinds, args.max_tokens)
        baseline = baseline or result["tokens_per_s"]
        ratio = round(result["tokens_per_s"] / baseline, 3)
        print(json.dumps({"config": name, "requests": args.requests, **result, "vs_none": ratio}))


if __name__ == "__main__":
    main()
