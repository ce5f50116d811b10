"""What quantized K/V (`--kv-bits`) costs in quality: next-token agreement with unquantized K/V.

The default model (or `--model`) scores a fixed text (tests/data/kv_quality.txt: ~2.4k words
of the project's own prose, snapshotted) through the engine's paged KV with prompt logprobs,
prefilled in chunks of 256, so every chunk after the first attends to K/V read back from the
pool. Per K/V layout it reports, against the unquantized pool: top-1 agreement (the most likely
next token at each position is the same) and the mean |logprob difference| of the text's own
next tokens. One run; the bar is top-1 >= 99% at 8 bits.

A second architecture is built tiny (`--models`, default both): "tiny-qwen3" (or "tiny-llama")
is `tests.support.engine_fixtures.tiny_quantizable_model`, random weights, 2 layers, head dim
64, a byte-level vocabulary (the text's first `--tiny-tokens` UTF-8 bytes are its tokens), so
it needs no download and takes seconds. Its numbers say how K/V rounding moves another
attention design (Qwen3's q/k norms) with no training to make its distributions peaked.

  PYTHONPATH=$PWD LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
      python scripts/kv_quality.py [--models default,tiny-qwen3] [--layouts 8:64,4:64,4:32]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shared.models.loading import load_model  # noqa: E402
from shared.models.store import resolve_model  # noqa: E402
from shared.sampling import SamplingParams  # noqa: E402
from worker.config import EngineConfig  # noqa: E402
from worker.engine.engine import Engine  # noqa: E402

TEXT = ROOT / "tests" / "data" / "kv_quality.txt"
NEAR_TIE = 0.1  # nats between the unquantized top-1 and top-2: a coin toss for any noise


def score(model, tokens: list[int], kv_bits: int | None, group: int) -> tuple[np.ndarray, ...]:
    """(logprob of each next token, the top-1 token at each position, its margin over the
    top-2 in nats) over the paged KV."""
    config = EngineConfig(
        kv_memory_bytes=256 << 20,
        kv_bits=kv_bits,
        kv_group_size=group,
        warmup=False,
        prefill_chunk=256,
        attention_backend="mlx",
    )
    engine = Engine.create(model, config, max_context=len(tokens) + 8)
    engine.add_request("q", tokens, SamplingParams(max_tokens=1, prompt_logprobs=2))
    first = None
    while engine.has_work():
        for delta in engine.step():
            assert delta.error is None, delta.error
            first = first or (delta if delta.prompt_logprobs is not None else None)
    top = [t.token_ids[0] for t in first.prompt_top_logprobs]
    margin = [t.logprobs[0] - t.logprobs[1] for t in first.prompt_top_logprobs]
    return np.array(first.prompt_logprobs), np.array(top), np.array(margin)


def model_and_tokens(name: str, args) -> tuple[object, list[int]]:
    """("default" or a model id: its tokenizer's tokens; "tiny-<arch>": UTF-8 bytes)."""
    if name.startswith("tiny-"):
        from tests.support.engine_fixtures import tiny_quantizable_model

        model = tiny_quantizable_model(name.removeprefix("tiny-"), vocab_size=256)
        return model, list(TEXT.read_bytes()[: args.tiny_tokens])
    model, tokenizer = load_model(resolve_model(None if name == "default" else name))
    return model, tokenizer.encode(TEXT.read_text())[: args.text_tokens]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--models",
        default="default,tiny-qwen3",
        help="default, a model id, tiny-qwen3 or tiny-llama, ... (default: %(default)s)",
    )
    p.add_argument("--layouts", default="8:64,8:32,4:64,4:32", help="bits:group_size, ...")
    p.add_argument("--tiny-tokens", type=int, default=4096, help="text bytes a tiny model scores")
    p.add_argument(
        "--text-tokens",
        type=int,
        default=None,
        help="score only the text's first N tokens with a real model (default: all, ~4.4k)",
    )
    args = p.parse_args(argv)
    for name in args.models.split(","):
        model, tokens = model_and_tokens(name, args)
        print(f"## {name}")
        report(model, tokens, args.layouts)


def report(model, tokens: list[int], layouts: str) -> None:
    base_lp, base_top, margin = score(model, tokens, None, 64)
    clear = margin >= NEAR_TIE
    print(
        f"{len(tokens)} tokens; unquantized: mean logprob {base_lp.mean():.4f}; "
        f"{(~clear).sum()} positions whose top-2 are within {NEAR_TIE} nats"
    )
    print("layout   top-1 agreement   (past near-ties)   mean |logprob diff|   mean logprob")
    for layout in layouts.split(","):
        bits, group = map(int, layout.split(":"))
        lp, top, _ = score(model, tokens, bits, group)
        same = top == base_top
        print(
            f"q{bits}g{group:<4} {same.mean():14.2%}   {same[clear].mean():16.2%}   "
            f"{np.abs(lp - base_lp).mean():19.4f}   {lp.mean():12.4f}"
        )


if __name__ == "__main__":
    main()
