"""Images placed in chat prompts, on the tokenizers of both tiny vision families."""

from __future__ import annotations

import base64

import pytest

from router.api.anthropic.parse import parse_messages_request
from router.api.openai.parse import parse_chat
from router.chat.images.decode import ImageLimits, decode_image
from router.chat.images.parts import image_source, user_image_parts
from router.chat.images.placement import PromptImages
from router.errors import ApiError
from router.text.tokenizer import ModelTokenizer
from shared.models.vision import IMAGE_KEY_BASE, image_keys
from tests.unit.router.images.conftest import VLM, chat_image, png


@pytest.fixture
def tokenizer(vision_dir) -> ModelTokenizer:
    return ModelTokenizer.load(vision_dir)


def decoded(body: dict) -> PromptImages:
    """What router/http/images.py hands the parser: the body's images, by source key."""
    by_key = {}
    for part, param in user_image_parts(body):
        source = image_source(part, param)
        data = base64.b64decode(source.base64)
        by_key[source.key] = decode_image(data, param, ImageLimits())
    return PromptImages(by_key)


def chat(body: dict, tokenizer: ModelTokenizer):
    return parse_chat(body, tokenizer, VLM, None, decoded(body))


def keys_of(req) -> list[int]:
    return [t for t in req.prompt_ids if t >= IMAGE_KEY_BASE]


def test_an_image_becomes_its_token_count_of_keys(tokenizer):
    req = chat(chat_image(png(40, 60)), tokenizer)
    spec = tokenizer.vision
    count = spec.image_tokens(40, 60)
    (image,) = req.images
    assert image.tokens == count and image.data == png(40, 60)
    keys = keys_of(req)
    assert keys == image_keys(decode_image(png(40, 60), "p", ImageLimits()).content_hash, count)
    assert spec.image_token_id not in req.prompt_ids  # every image token became a key


def test_the_prompt_is_the_placeholder_expanded_then_tokenized(tokenizer):
    """What the processor does: the placeholder inlined where the image was, replaced by
    the image's expansion as text, then tokenized."""
    req = chat(chat_image(png(40, 60), text="What is this?"), tokenizer)
    spec = tokenizer.vision
    messages = [{"role": "user", "content": "What is this?" + spec.placeholder}]
    text = tokenizer.render_chat(messages).replace(spec.placeholder, spec.expand(40, 60), 1)
    expected = tokenizer.encode_text(text)
    real = [t if t < IMAGE_KEY_BASE else spec.image_token_id for t in req.prompt_ids]
    assert real == expected


def test_the_same_image_gets_the_same_keys_and_another_image_others(tokenizer):
    first = keys_of(chat(chat_image(png(seed=1)), tokenizer))
    again = keys_of(chat(chat_image(png(seed=1), text="Describe it."), tokenizer))
    other = keys_of(chat(chat_image(png(seed=2)), tokenizer))
    assert first == again and set(first).isdisjoint(other)


def test_two_images_in_order_with_their_own_counts(tokenizer):
    a, b = png(40, 60, seed=1), png(64, 20, seed=2)
    body = chat_image(a)
    body["messages"].append({"role": "assistant", "content": "A cat."})
    body["messages"].append(chat_image(b, text="And this?")["messages"][0])
    req = chat(body, tokenizer)
    spec = tokenizer.vision
    assert [i.data for i in req.images] == [a, b]
    assert [i.tokens for i in req.images] == [spec.image_tokens(40, 60), spec.image_tokens(64, 20)]
    assert len(keys_of(req)) == sum(i.tokens for i in req.images)


def test_the_context_length_counts_the_expanded_tokens(tokenizer):
    req = chat(chat_image(png()), tokenizer)
    room = tokenizer.context_length - len(req.prompt_ids)
    body = chat_image(png()) | {"max_tokens": room + 1}
    with pytest.raises(ApiError, match="maximum context length"):
        chat(body, tokenizer)


def test_a_typed_placeholder_is_a_400(tokenizer):
    body = chat_image(png(), text=f"look: {tokenizer.vision.placeholder}")
    with pytest.raises(ApiError) as caught:
        chat(body, tokenizer)
    assert caught.value.status == 400 and caught.value.code == "image_placement_failed"


def test_a_typed_image_token_without_an_image_is_a_400(tokenizer):
    text = f"hi {tokenizer.vision.image_token}"
    body = {"model": VLM, "messages": [{"role": "user", "content": text}]}
    with pytest.raises(ApiError) as caught:
        chat(body, tokenizer)
    assert caught.value.code == "image_placement_failed"


def test_an_image_the_router_did_not_decode_is_a_400_not_a_crash(tokenizer):
    with pytest.raises(ApiError) as caught:
        parse_chat(chat_image(png()), tokenizer, VLM, None, PromptImages())
    assert caught.value.status == 400


def test_prompt_logprobs_are_refused_with_images(tokenizer):
    with pytest.raises(ApiError) as caught:
        chat(chat_image(png()) | {"prompt_logprobs": 1}, tokenizer)
    assert caught.value.param == "prompt_logprobs"


def test_an_anthropic_image_block_places_like_an_openai_part(tokenizer):
    data = png()
    block = {
        "type": "image",
        "source": {
            "type": "base64",
            "media_type": "image/png",
            "data": base64.b64encode(data).decode(),
        },
    }
    content = [{"type": "text", "text": "What is this?"}, block]
    body = {"model": VLM, "max_tokens": 3, "messages": [{"role": "user", "content": content}]}
    req = parse_messages_request(body, tokenizer, VLM, None, decoded(body))
    assert req.prompt_ids == chat(chat_image(data), tokenizer).prompt_ids
    assert req.images == chat(chat_image(data), tokenizer).images


def test_a_model_without_vision_refuses_images_in_one_sentence(tiny_model_dir):
    from router.chat.images.placement import vision_spec_of

    tokenizer = ModelTokenizer.load(tiny_model_dir)
    with pytest.raises(ApiError) as caught:
        vision_spec_of(tokenizer, "tiny", "messages[0].content[1]")
    assert "model 'tiny' does not take images" in caught.value.message
    assert caught.value.code == "image_input_unsupported"


def test_a_vision_family_not_served_says_which(tmp_path, vision_dirs):
    import json
    import shutil

    from router.chat.images.placement import vision_spec_of

    model = shutil.copytree(vision_dirs["gemma3"], tmp_path / "qwen")
    config = json.loads((model / "config.json").read_text()) | {"model_type": "llava"}
    (model / "config.json").write_text(json.dumps(config))
    tokenizer = ModelTokenizer.load(model)
    assert tokenizer.vision is None
    with pytest.raises(ApiError, match="images are not served for 'llava' models"):
        vision_spec_of(tokenizer, "qwen")


def test_an_image_the_size_rule_refuses_is_a_400_naming_it(tokenizer):
    """Qwen-VL's resize refuses an aspect ratio over 200: a 400, not a 500."""
    body = chat_image(png(402, 2))
    if tokenizer.vision.family not in ("qwen2_5_vl", "qwen3_vl"):
        chat(body, tokenizer)  # the other families take it
        return
    with pytest.raises(ApiError) as caught:
        chat(body, tokenizer)
    assert caught.value.status == 400 and "402x2 image cannot be used" in caught.value.message
