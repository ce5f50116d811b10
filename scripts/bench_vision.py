#!/usr/bin/env python
"""Images in prompts: time to first token of a request with an image, in one process.

Model (`--family`): a Gemma-3-shaped vision-language model (a SigLIP tower over 224×224
pixels pooled to 64 image tokens; a 12-layer language model with sliding-window and full
layers), or a Qwen2.5-VL-shaped one (its windowed tower, 16 image tokens, M-RoPE), random
weights, written as a checkpoint both mlx-lm and mlx-vlm load (`tests.support.arch_zoo.vision`).
Prompt: a ~300-token system text, the image, a question. Measured, medians of `--repeats`:

  - ours, no hit: the engine's prefix cache emptied first (vision tower and whole prefill);
  - ours, repeat: the same request again (its blocks cached: the vision tower does not run,
    only the last block is computed);
  - mlx-vlm: its own `generate_step` on the same model, image and prompt (the baseline).

Prints one JSON line per measurement and the ratios.   Usage: scripts/bench_vision.py [--help]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shared.blas import active_blas, reexec_with_blas  # noqa: E402

SHAPES = {  # family -> (text settings, vision settings) over the tiny ones
    "gemma3": (
        dict(
            hidden_size=512,
            num_hidden_layers=12,
            intermediate_size=1536,
            num_attention_heads=8,
            head_dim=64,
            num_key_value_heads=2,
            sliding_window=512,
            sliding_window_pattern=6,
            mm_tokens_per_image=64,
            query_pre_attn_scalar=64,
            max_position_embeddings=4096,
        ),
        dict(
            num_hidden_layers=6,
            hidden_size=384,
            intermediate_size=1536,
            num_attention_heads=6,
            patch_size=14,
            image_size=224,
        ),
    ),
    # Qwen2.5-VL: M-RoPE positions (head_dim 64: 32 rotated pairs in t, h, w sections); its
    # processor's pixel bounds in the tiny checkpoint give an image 16 tokens
    "qwen2_5_vl": (
        dict(
            hidden_size=512,
            num_hidden_layers=12,
            intermediate_size=1536,
            num_attention_heads=8,
            num_key_value_heads=2,
            max_position_embeddings=4096,
            rope_scaling={"type": "mrope", "mrope_section": [8, 12, 12]},
        ),
        dict(
            depth=6,
            hidden_size=384,
            intermediate_size=1536,
            num_heads=6,
            out_hidden_size=512,
            window_size=112,
            fullatt_block_indexes=[2, 5],
        ),
    ),
}
SYSTEM = "you are a helpful assistant; answer the user. " * 30


def prompt(directory: Path, image: bytes):
    """(real ids, keyed ids, images) as the router builds them."""
    from io import BytesIO

    from PIL import Image
    from transformers import AutoTokenizer

    from shared.models.vision import image_hash, image_keys, vision_spec
    from shared.protocol import ImageInput

    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    spec = vision_spec(directory, tokenizer.convert_ids_to_tokens)
    decoded = Image.open(BytesIO(image)).convert("RGB")
    text = SYSTEM + spec.expand(*decoded.size) + " what is in this picture?"
    ids = tokenizer.encode(text, add_special_tokens=False)
    count = spec.image_tokens(*decoded.size)
    keys = iter(image_keys(image_hash(decoded.tobytes(), "RGB", decoded.size), count))
    keyed = [next(keys) if t == spec.image_token_id else t for t in ids]
    return ids, keyed, (ImageInput(image, count),)


def ours_ttft(engine, keyed, images) -> tuple[float, int]:
    from shared.sampling import SamplingParams

    start = time.perf_counter()
    engine.add_request("r", keyed, SamplingParams(max_tokens=1), images=images)
    first, cached = None, 0
    while engine.has_work():
        for delta in engine.step():
            if delta.token_ids and first is None:
                first = time.perf_counter() - start
            if delta.usage is not None:
                cached = delta.usage.cached_tokens
    return first, cached


def mlx_vlm_ttft(vlm, processor, ids, image: bytes) -> float:
    """mlx-vlm's own prefill to its first token (its image processor included)."""
    from io import BytesIO

    import mlx.core as mx
    from mlx_vlm.generate.ar import generate_step
    from PIL import Image

    start = time.perf_counter()
    pixels = processor(images=[Image.open(BytesIO(image)).convert("RGB")], return_tensors="np")
    extras = {k: mx.array(pixels[k]) for k in ("image_grid_thw",) if k in pixels}
    x = mx.array([ids])
    pixel_values = mx.array(pixels["pixel_values"])
    steps = generate_step(x, vlm, pixel_values, mx.ones(x.shape), max_tokens=1, **extras)
    token, _ = next(steps)
    mx.eval(token)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement (median)")
    parser.add_argument(
        "--family", choices=sorted(SHAPES), default="gemma3", help="the model's shape"
    )
    args = parser.parse_args()
    reexec_with_blas()
    from mlx_vlm.utils import load_model as load_vlm
    from mlx_vlm.utils import load_processor
    from transformers import AutoImageProcessor

    from tests.support.arch_zoo.vision import build_vision_model, sample_image
    from worker.config import EngineConfig
    from worker.engine.engine import Engine

    text, vision = SHAPES[args.family]
    directory = build_vision_model(
        args.family, Path(tempfile.mkdtemp()) / "vlm", text=text, vision=vision
    )
    engine = Engine.from_path(directory, EngineConfig(block_size=16, num_blocks=1024))
    vlm = load_vlm(directory)
    if args.family == "gemma3":
        processor = AutoImageProcessor.from_pretrained(str(directory))
    else:  # mlx-vlm's own processor for Qwen-VL
        processor = load_processor(directory).image_processor
    image = sample_image(640, 480, seed=1)
    ids, keyed, images = prompt(directory, image)
    runs: dict[str, list[float]] = {"ours_no_hit": [], "ours_repeat": [], "mlx_vlm": []}
    cached = 0
    for _ in range(args.repeats):
        engine.forget_cache()
        runs["ours_no_hit"].append(ours_ttft(engine, keyed, images)[0])
        seconds, cached = ours_ttft(engine, keyed, images)
        runs["ours_repeat"].append(seconds)
        runs["mlx_vlm"].append(mlx_vlm_ttft(vlm, processor, ids, image))
    medians = {name: statistics.median(v) for name, v in runs.items()}
    for name, seconds in medians.items():
        print(
            json.dumps(
                {
                    "measure": f"ttft_{name}",
                    "family": args.family,
                    "seconds": round(seconds, 4),
                    "prompt_tokens": len(ids),
                    "runs": [round(s, 4) for s in runs[name]],
                }
            )
        )
    print(
        json.dumps(
            {
                "measure": "ratios",
                "blas": active_blas(),
                "repeat_cached_tokens": cached,
                "no_hit_vs_repeat": round(medians["ours_no_hit"] / medians["ours_repeat"], 2),
                "mlx_vlm_vs_ours_no_hit": round(medians["mlx_vlm"] / medians["ours_no_hit"], 2),
                "mlx_vlm_vs_ours_repeat": round(medians["mlx_vlm"] / medians["ours_repeat"], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
