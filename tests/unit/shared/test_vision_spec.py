"""`shared.models.vision.VisionSpec` against mlx-vlm's own processors: the router expands an
image placeholder to exactly the token ids the model's processor makes, for images of many
sizes (small, fitted within the longest edge, extreme aspect ratios), without running the
image processor itself."""

from __future__ import annotations

import io

import pytest

pytest.importorskip("mlx_vlm")

from PIL import Image  # noqa: E402

from shared.models.vision import image_hash, image_keys, vision_spec  # noqa: E402
from tests.support.arch_zoo.vision import FAMILIES, QWEN, build_vision_model, sample_image  # noqa: E402

SIZES = [(40, 60), (64, 64), (17, 5), (300, 90), (90, 300), (1000, 999), (1, 1)]


@pytest.fixture(scope="module", params=FAMILIES)
def model(request, tmp_path_factory):
    from transformers import AutoImageProcessor, AutoTokenizer

    family = request.param
    directory = build_vision_model(family, tmp_path_factory.mktemp(family))
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    spec = vision_spec(directory, tokenizer.convert_ids_to_tokens)
    if family in QWEN:  # mlx-vlm's own processor, image side included
        from mlx_vlm.utils import load_processor

        return spec, tokenizer, load_processor(directory)
    images = AutoImageProcessor.from_pretrained(str(directory))
    if family == "gemma3":
        from mlx_vlm.models.gemma3.processing_gemma3 import Gemma3Processor

        tokenizer.boi_token, tokenizer.eoi_token = spec.boi, spec.eoi
        tokenizer.image_token, tokenizer.image_token_id = spec.image_token, spec.image_token_id
        processor = Gemma3Processor(images, tokenizer, image_seq_length=spec.tokens_per_image)
    else:
        from mlx_vlm.models.mistral3.processing_mistral3 import Mistral3Processor

        processor = Mistral3Processor(images, tokenizer, patch_size=8, spatial_merge_size=2)
    return spec, tokenizer, processor


@pytest.mark.parametrize("size", SIZES)
def test_expansion_equals_the_processors_token_ids(model, size):
    spec, tokenizer, processor = model
    image = Image.open(io.BytesIO(sample_image(*size))).convert("RGB")
    text = f"hello world {spec.placeholder} what is it?"
    want = processor(images=[image], text=text)["input_ids"]
    want = [int(t) for t in (want[0] if hasattr(want[0], "__len__") else want).tolist()]
    ours = tokenizer.encode(
        text.replace(spec.placeholder, spec.expand(*image.size)), add_special_tokens=False
    )
    if want[: len(ours)] != ours:  # a processor that adds the tokenizer's special tokens
        want = want[len(want) - len(ours) :]
    assert ours == want
    assert sum(t == spec.image_token_id for t in ours) == spec.image_tokens(*image.size)


def test_keys_differ_by_image_and_position():
    a, b = (
        image_hash(b"\x00" * 12, "RGB", (2, 2)),
        image_hash(b"\x01" + b"\x00" * 11, "RGB", (2, 2)),
    )
    assert a != b
    assert image_keys(a, 3) == image_keys(a, 3)
    assert not set(image_keys(a, 3)) & set(image_keys(b, 3))
    assert image_hash(b"\x00" * 12, "RGB", (2, 2)) != image_hash(b"\x00" * 12, "RGB", (4, 1))


def test_a_vision_model_we_do_not_place_is_named(tmp_path):
    import json

    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "llava", "vision_config": {}, "image_token_id": 5})
    )
    with pytest.raises(ValueError, match="'llava'"):
        vision_spec(tmp_path, str)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert vision_spec(tmp_path, str) is None
