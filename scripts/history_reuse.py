"""Reasoning in history: per turn of a three-turn tool loop, how much of the prompt the
worker's prefix cache holds, and where the rendered history first leaves what the model wrote.

For Qwen3, gpt-oss (harmony), DeepSeek R1 and V3.1 (its default non-thinking mode, and
thinking mode), with their real chat templates (tests/data/dialects/) and the router's own
prompt building; the loop and what is measured are described in
tests/support/dialects/tool_loop.py. Offline, a few seconds. One JSON line per (family, turn):

    prompt_tokens, common_prefix_tokens / common_share (shared with the previous turn's prompt
    and reply), cached_tokens / cached_share (the whole-block hit a full-attention worker
    reads), hybrid_cached_tokens / hybrid_cached_share (that hit cut to a recurrent-state
    snapshot), diverges_at / diverges_from_prompt_end (the first differing token) and
    `divergence`: the shared text `before` it, then what follows it in what the model
    generated (`generated`) and in what the history renders (`rendered`).

    python scripts/history_reuse.py [--block-size 32] [--drop-reasoning] [--family qwen3]

`--drop-reasoning`: the client sends earlier replies back without `reasoning_content` (the
OpenAI SDK's own message objects carry none).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shared.config.choices import DEFAULT_BLOCK_SIZE  # noqa: E402
from tests.support.dialects.tool_loop import LOOP_FAMILIES, family_tokenizer, run_loop  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE)
    parser.add_argument("--drop-reasoning", action="store_true")
    parser.add_argument("--family", action="append", choices=sorted(LOOP_FAMILIES))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="history-reuse-") as root:
        tokenizers = {}
        for name in args.family or LOOP_FAMILIES:
            family = LOOP_FAMILIES[name]
            if family.spec not in tokenizers:
                tokenizers[family.spec] = family_tokenizer(family.spec, Path(root))
            for turn in run_loop(
                family, tokenizers[family.spec], args.block_size, args.drop_reasoning
            ):
                record = turn.record(args.block_size, not args.drop_reasoning)
                print(json.dumps(record, ensure_ascii=False), flush=True)


if __name__ == "__main__":
    main()
