"""Tiny random-weight vision-language model directories that both mlx-lm and mlx-vlm load.

`build_vision_model(family, directory)` writes what a hub checkpoint has: config.json (the
text and vision configs, the image token ids), model.safetensors in mlx-vlm's layout (the
language model under `language_model.`, the vision tower, the projector), a byte-level BPE
tokenizer with the family's image tokens added, a ChatML template and preprocessor_config.json
for the family's image processor. Two families, each on its own rule for how many tokens an
image becomes:

- gemma3: a SigLIP tower over 56×56 pixels (4×4 patches of 14) pooled to 4 tokens an image,
  between <start_of_image> and <end_of_image>; sliding-window and full layers.
- mistral3: a Pixtral tower over images fitted within 64 pixels, one token per 16×16 (patch 8
  merged 2×2), rows ended by [IMG_BREAK] and the image by [IMG_END].
- qwen2_5_vl: Qwen2.5-VL's windowed tower over images resized (`smart_resize`) to between 4
  and 16 tokens of 28×28 (patch 14 merged 2×2), between <|vision_start|> and <|vision_end|>;
  its language model places them at 3-D (M-RoPE) positions. The config is flat (the text
  settings at the top), as on the hub.
- qwen2_vl: the same with Qwen2-VL's tower (full attention, no window).
- qwen3_vl: Qwen3-VL, patch 16 merged 2×2 (32×32 a token), its text config nested, and
  deepstack: the tower's features of one middle layer added to the image tokens' hidden states
  after the first language layer.

Needs mlx-vlm (the `vision` extra); tests skip without it.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.tiny_model import build_tiny_model

FAMILIES = ("gemma3", "mistral3", "qwen2_5_vl", "qwen2_vl", "qwen3_vl")
QWEN = ("qwen2_5_vl", "qwen2_vl", "qwen3_vl")
_SPECIALS = {
    "gemma3": ["<start_of_image>", "<end_of_image>", "<image_soft_token>"],
    "mistral3": ["[IMG]", "[IMG_BREAK]", "[IMG_END]"],
    "qwen2_5_vl": ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"],
}
_SPECIALS["qwen2_vl"] = _SPECIALS["qwen3_vl"] = _SPECIALS["qwen2_5_vl"]


def _text_config(family: str, vocab: int) -> dict:
    if family == "gemma3":
        return dict(
            model_type="gemma3_text",
            hidden_size=64,
            num_hidden_layers=2,
            intermediate_size=128,
            num_attention_heads=4,
            head_dim=16,
            num_key_value_heads=1,
            vocab_size=vocab,
            sliding_window=8,
            sliding_window_pattern=2,
            mm_tokens_per_image=4,
            query_pre_attn_scalar=16,
            max_position_embeddings=512,
        )
    if family == "qwen3_vl":  # head_dim 16: 8 rotated pairs, t, h, w interleaved
        return dict(
            model_type="qwen3_vl_text",
            hidden_size=64,
            num_hidden_layers=2,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            vocab_size=vocab,
            rms_norm_eps=1e-6,
            rope_theta=10000.0,
            max_position_embeddings=512,
            tie_word_embeddings=True,
            rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3], "mrope_interleaved": True},
        )
    if family in QWEN:  # head_dim 16: 8 rotated pairs in t, h, w sections
        return dict(
            model_type=family,
            hidden_size=64,
            num_hidden_layers=2,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=vocab,
            rms_norm_eps=1e-6,
            rope_theta=10000.0,
            max_position_embeddings=512,
            tie_word_embeddings=True,
            rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
        )
    return dict(
        model_type="mistral",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=4,
        head_dim=16,
        num_key_value_heads=2,
        vocab_size=vocab,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        max_position_embeddings=512,
    )


def _vision_config(family: str) -> dict:
    if family == "gemma3":
        return dict(
            model_type="siglip_vision_model",
            num_hidden_layers=2,
            hidden_size=32,
            intermediate_size=64,
            num_attention_heads=2,
            patch_size=14,
            image_size=56,
        )
    if family == "qwen2_5_vl":
        return dict(
            model_type="qwen2_5_vl",
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            out_hidden_size=64,
            num_heads=2,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            window_size=56,
            fullatt_block_indexes=[1],
        )
    if family == "qwen3_vl":
        return dict(
            model_type="qwen3_vl",
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            out_hidden_size=64,
            num_heads=2,
            patch_size=16,
            spatial_merge_size=2,
            temporal_patch_size=2,
            num_position_embeddings=16,
            deepstack_visual_indexes=[0],
        )
    if family == "qwen2_vl":
        return dict(
            model_type="qwen2_vl",
            depth=2,
            embed_dim=32,
            hidden_size=64,
            num_heads=2,
            mlp_ratio=2,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
        )
    return dict(
        model_type="pixtral",
        num_hidden_layers=2,
        hidden_size=32,
        head_dim=16,
        intermediate_size=64,
        num_attention_heads=2,
        image_size=64,
        patch_size=8,
    )


def _preprocessor(family: str) -> dict:
    if family == "gemma3":
        return {
            "image_processor_type": "Gemma3ImageProcessor",
            "size": {"height": 56, "width": 56},
            "image_mean": [0.5, 0.5, 0.5],
            "image_std": [0.5, 0.5, 0.5],
            "do_pan_and_scan": False,
        }
    if family in QWEN:
        patch = 16 if family == "qwen3_vl" else 14
        pixels = (2 * patch) ** 2  # one merged 2×2 patch
        return {
            "image_processor_type": "Qwen2VLImageProcessor",
            "patch_size": patch,
            "merge_size": 2,
            "temporal_patch_size": 2,
            "min_pixels": 4 * pixels,
            "max_pixels": 16 * pixels,
            "size": {"shortest_edge": 4 * pixels, "longest_edge": 16 * pixels},
            "image_mean": [0.48145466, 0.4578275, 0.40821073],
            "image_std": [0.26862954, 0.26130258, 0.27577711],
        }
    return {
        "image_processor_type": "PixtralImageProcessor",
        "size": {"longest_edge": 64},
        "patch_size": 8,
        "image_break_token": "[IMG_BREAK]",
        "image_end_token": "[IMG_END]",
    }


def build_vision_model(
    family: str,
    directory: Path,
    seed: int = 0,
    text: dict | None = None,
    vision: dict | None = None,
) -> Path:
    """Write a tiny `family` checkpoint into `directory`; return it. `text` and `vision`:
    settings over the tiny ones (a benchmark's bigger model)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from tokenizers import Tokenizer

    directory = build_tiny_model(Path(directory), context_length=512)
    eos = json.loads((directory / "config.json").read_text())["eos_token_id"]
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tokenizer.add_special_tokens(_SPECIALS[family])
    tokenizer.save(str(directory / "tokenizer.json"))
    ids = [tokenizer.token_to_id(t) for t in _SPECIALS[family]]
    vocab = tokenizer.get_vocab_size()
    text = _text_config(family, vocab) | (text or {})
    vision = _vision_config(family) | (vision or {})
    config: dict = {"model_type": family, "text_config": text, "vision_config": vision}
    config |= {"eos_token_id": eos, "vocab_size": vocab}
    if family == "gemma3":
        from mlx_vlm.models.gemma3 import Model, ModelConfig, TextConfig, VisionConfig

        config |= dict(
            boi_token_index=ids[0],
            eoi_token_index=ids[1],
            image_token_index=ids[2],
            mm_tokens_per_image=text["mm_tokens_per_image"],
            hidden_size=text["hidden_size"],
            pad_token_id=0,
        )
    elif family == "mistral3":
        from mlx_vlm.models.mistral3 import Model, ModelConfig, TextConfig, VisionConfig

        config |= dict(image_token_index=ids[0], spatial_merge_size=2)
    else:
        import importlib

        module = importlib.import_module(f"mlx_vlm.models.{family}")
        Model, ModelConfig = module.Model, module.ModelConfig
        TextConfig, VisionConfig = module.TextConfig, module.VisionConfig
        config = text | {"vision_config": vision, "eos_token_id": eos}
        if family == "qwen3_vl":  # nested, as its hub configs are
            config = {"model_type": family, "text_config": text, "vision_config": vision}
            config |= {"eos_token_id": eos, "tie_word_embeddings": True}
        config |= dict(
            vision_start_token_id=ids[0],
            vision_end_token_id=ids[1],
            image_token_id=ids[2],
            video_token_id=ids[3],
        )
    model_config = ModelConfig.from_dict(config | {"vision_config": vision})
    # the nested configs as mlx-vlm's loader makes them (its from_dict keeps dicts)
    model_config.text_config = TextConfig.from_dict(text)
    model_config.vision_config = VisionConfig.from_dict(vision)
    mx.random.seed(seed)
    model = Model(model_config)
    weights = dict(tree_flatten(model.parameters()))
    if family == "gemma3":  # Gemma ties its output projection to the embedding
        weights["language_model.lm_head.weight"] = weights[
            "language_model.model.embed_tokens.weight"
        ]
    mx.save_safetensors(str(directory / "model.safetensors"), weights)
    (directory / "config.json").write_text(json.dumps(config))
    pre = _preprocessor(family)
    if family == "gemma3":
        pre["size"] = {"height": vision["image_size"], "width": vision["image_size"]}
    (directory / "preprocessor_config.json").write_text(json.dumps(pre))
    return directory


def sample_image(width: int = 40, height: int = 60, seed: int = 0, fmt: str = "PNG") -> bytes:
    """An encoded random RGB image."""
    import io

    import numpy as np
    from PIL import Image

    pixels = (np.random.default_rng(seed).random((height, width, 3)) * 255).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt)
    return out.getvalue()


def image_prompt(tokenizer, spec, text_before: str, image: bytes | None, text_after: str):
    """(real ids, keyed ids, images) of a prompt with one image between two texts, the way
    the router builds them (shared.models.vision)."""
    from io import BytesIO

    from PIL import Image

    from shared.models.vision import image_hash, image_keys
    from shared.protocol import ImageInput

    if image is None:
        ids = tokenizer.encode(text_before + text_after, add_special_tokens=False)
        return ids, ids, ()
    decoded = Image.open(BytesIO(image)).convert("RGB")
    text = text_before + spec.expand(*decoded.size) + text_after
    ids = tokenizer.encode(text, add_special_tokens=False)
    count = spec.image_tokens(*decoded.size)
    keys = iter(image_keys(image_hash(decoded.tobytes(), "RGB", decoded.size), count))
    keyed = [next(keys) if t == spec.image_token_id else t for t in ids]
    assert sum(t == spec.image_token_id for t in ids) == count
    return ids, keyed, (ImageInput(image, count),)
