"""Images end to end, real processes: launch-cluster serving tiny random-weight Gemma 3,
Mistral 3 and Qwen2.5-VL vision models (tests/support/arch_zoo/vision.py) and a tiny text
model, one worker each, asked through the official openai and anthropic SDKs. An image sent
as a data URL or a base64 block is answered with usage; the same image again hits the
worker's cache; every malformed image is a 4xx with an error body, never a 5xx or a hang;
the text model asked with an image says it takes none."""

from __future__ import annotations

import base64
import struct
import zlib

import anthropic
import openai
import pytest

from tests.support.launched import get_json, launch_cluster, wait_for_models
from tests.support.tp_group import save_tiny_model

pytest.importorskip("mlx_vlm", reason="the vision extra (pip install 'mlx-fleet[vision]')")
pytestmark = pytest.mark.slow

MODELS = {"gemma": "gemma3", "mistral": "mistral3", "qwen": "qwen2_5_vl"}  # id -> family


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    from tests.support.arch_zoo.vision import build_vision_model

    work = tmp_path_factory.mktemp("images-e2e")
    lines = []
    for name, family in MODELS.items():
        path = build_vision_model(family, work / name)
        lines.append(f'[[models]]\npath = "{path}"\nid = "{name}"\n')
    text = save_tiny_model(work / "text", seed=3)
    lines.append(f'[[models]]\npath = "{text}"\nid = "text"\n')
    config = work / "fleet.toml"
    config.write_text("".join(lines))
    args = ["--config", str(config), "--workers", "1", "--kv-memory", "64MiB"]
    with launch_cluster(args, work) as (base, _):
        try:
            wait_for_models(base, dict.fromkeys([*MODELS, "text"], 1))
            yield base
        finally:
            for log in work.glob("*.log"):
                print(f"---- {log.name}\n{log.read_text()[-3000:]}")


@pytest.fixture
def oai(url):
    with openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120) as client:
        yield client


@pytest.fixture
def claude(url):
    with anthropic.Anthropic(base_url=url, api_key="x", max_retries=0, timeout=120) as client:
        yield client


def png(width: int = 40, height: int = 60, seed: int = 0) -> bytes:
    from tests.support.arch_zoo.vision import sample_image

    return sample_image(width, height, seed)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def image_message(url: str, text: str = "What is in this picture?") -> list[dict]:
    content = [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}]
    return [{"role": "user", "content": content}]


@pytest.mark.parametrize("model", list(MODELS))
def test_a_data_url_image_is_answered_and_hits_the_cache_when_sent_again(oai, model):
    messages = image_message(f"data:image/png;base64,{b64(png(seed=7))}", "Describe it. " * 8)
    first = oai.chat.completions.create(model=model, messages=messages, max_tokens=4, temperature=0)
    assert first.choices[0].message.content is not None and first.usage.completion_tokens > 0
    text_only = oai.chat.completions.create(
        model=model, max_tokens=1, messages=[{"role": "user", "content": "Describe it. " * 8}]
    )
    assert first.usage.prompt_tokens > text_only.usage.prompt_tokens  # the image's tokens
    again = oai.chat.completions.create(model=model, messages=messages, max_tokens=4, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens > 0
    assert again.choices[0].message.content == first.choices[0].message.content


@pytest.mark.parametrize("model", list(MODELS))
def test_an_anthropic_base64_block_is_answered(claude, model):
    block = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": b64(png(64, 32, seed=3))},
    }
    reply = claude.messages.create(
        model=model,
        max_tokens=4,
        messages=[{"role": "user", "content": [{"type": "text", "text": "What is it?"}, block]}],
    )
    assert reply.content and reply.usage.input_tokens > 0 and reply.usage.output_tokens > 0


def _bomb() -> bytes:
    """A PNG header claiming 100000 x 100000 pixels."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    ihdr = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


MALFORMED = {
    "bad base64": image_message("data:image/png;base64,!!!not-base64!!!"),
    "not an image": image_message(f"data:image/png;base64,{b64(b'just some text')}"),
    "http URL": image_message("https://example.com/cat.png"),
    "pixel bomb": image_message(f"data:image/png;base64,{b64(_bomb())}"),
    "not a data URL": image_message("file:///etc/passwd"),
    "image in a system message": [
        {
            "role": "system",
            "content": image_message(f"data:image/png;base64,{b64(png())}")[0]["content"],
        },
        {"role": "user", "content": "hi"},
    ],
    "too many images": [
        {
            "role": "user",
            "content": [
                {
                    "type": "image_url",
                    "image_url": {"url": f"data:image/png;base64,{b64(png(seed=s))}"},
                }
                for s in range(9)
            ],
        }
    ],
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_images_are_4xx_with_an_error_body(oai, case):
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(model="gemma", messages=MALFORMED[case], max_tokens=2)
    error = caught.value.body
    assert error["message"] and error["type"] == "invalid_request_error", error


def test_malformed_anthropic_and_responses_images_are_400s(oai, claude):
    url_block = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(
            model="gemma", max_tokens=2, messages=[{"role": "user", "content": [url_block]}]
        )
    assert "does not fetch image URLs" in caught.value.body["error"]["message"]
    part = {"type": "input_image", "file_id": "file-123"}
    with pytest.raises(openai.BadRequestError) as caught:
        oai.responses.create(model="gemma", input=[{"role": "user", "content": [part]}])
    assert caught.value.body["code"] == "unsupported_image_source"


def test_a_text_model_asked_with_an_image_says_it_takes_none(oai, claude):
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(
            model="text",
            max_tokens=2,
            messages=image_message(f"data:image/png;base64,{b64(png())}"),
        )
    assert "model 'text' does not take images" in caught.value.body["message"]
    block = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": b64(png())},
    }
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(
            model="text", max_tokens=2, messages=[{"role": "user", "content": [block]}]
        )
    assert "does not take images" in caught.value.body["error"]["message"]


def test_models_say_which_take_images(oai, url):
    listed = {m["id"]: m["input_modalities"] for m in get_json(f"{url}/v1/models")["data"]}
    assert listed == {**dict.fromkeys(MODELS, ["text", "image"]), "text": ["text"]}
    vision = {w["model"]: w["vision"] for w in get_json(f"{url}/v1/cluster")["workers"]}
    assert vision == {**dict.fromkeys(MODELS, True), "text": False}
