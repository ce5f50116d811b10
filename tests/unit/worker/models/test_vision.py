"""Vision-language models (issue 36): images through mlx-vlm's vision side into our paged
language model, over tiny random-weight Gemma 3, Mistral 3 and Qwen2-VL / Qwen2.5-VL /
Qwen3-VL (3-D M-RoPE positions; Qwen3-VL's deepstack) checkpoints
(`tests.support.arch_zoo.vision`), with greedy output (and logprobs) equal to mlx-vlm's own
`generate_step` on the same model, image and prompt:

- alone, and batched with text-only prompts, in prefill chunks that cut through the image;
- each of n choices (forked off the prompt);
- repeated: served from the prefix cache (the vision tower does not run again), same output;
- the same prompt with another image: no hit past the image's first token;
- refused, in one sentence, where images cannot be taken.
"""

from __future__ import annotations

import pytest

pytest.importorskip("mlx_vlm")

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from shared.models.loading import load_model  # noqa: E402
from shared.models.vision import image_hash, image_keys, vision_spec  # noqa: E402
from shared.protocol import ImageInput  # noqa: E402
from shared.sampling import InvalidRequest, SamplingParams  # noqa: E402
from tests.support.arch_zoo.vision import (  # noqa: E402
    FAMILIES,
    QWEN,
    build_vision_model,
    image_prompt,
    sample_image,
)
from tests.support.engine_fixtures import make_engine, reference_greedy  # noqa: E402

MAX_TOKENS = 8


@pytest.fixture(scope="module", params=FAMILIES)
def family_dir(request, tmp_path_factory):
    return request.param, build_vision_model(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def loaded(family_dir):
    family, directory = family_dir
    model, tokenizer = load_model(directory, "float32")
    spec = vision_spec(directory, tokenizer.convert_ids_to_tokens)
    return family, directory, model, tokenizer, spec


def _engine(loaded, **overrides):
    _, directory, model, tokenizer, _ = loaded
    engine = make_engine(model, **overrides)
    return engine.open_vision(directory, tokenizer)


def _prompt(loaded, text_before: str, image: bytes | None, text_after: str):
    """(real ids, keyed ids, images) the way the router builds them (shared.models.vision)."""
    _, _, _, tokenizer, spec = loaded
    return image_prompt(tokenizer, spec, text_before, image, text_after)


def _mlx_vlm_greedy(loaded, ids: list[int], image: bytes, logprobs: list | None = None):
    """mlx-vlm's own generation: its model, its image processor, greedy (the tokens; each
    one's logprob appended to `logprobs` when given)."""
    from io import BytesIO

    from mlx_vlm.generate.ar import generate_step
    from mlx_vlm.utils import load_model as load_vlm
    from PIL import Image
    from transformers import AutoImageProcessor

    family, directory, _, _, spec = loaded
    vlm = load_vlm(directory)
    if family in QWEN:  # mlx-vlm's own numpy processor
        from mlx_vlm.utils import load_processor

        processor = load_processor(directory).image_processor
    else:
        processor = AutoImageProcessor.from_pretrained(str(directory))
    kwargs = {"patch_size": spec.patch} if family == "mistral3" else {}
    pixels = processor(
        images=[Image.open(BytesIO(image)).convert("RGB")], return_tensors="np", **kwargs
    )
    extras = {k: mx.array(pixels[k]) for k in ("image_sizes", "image_grid_thw") if k in pixels}
    x = mx.array([ids])
    out = []
    steps = generate_step(
        x,
        vlm,
        mx.array(pixels["pixel_values"]),
        mx.ones(x.shape),
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        **extras,
    )
    for token, scores in steps:
        out.append(int(token.item() if hasattr(token, "item") else token))
        if logprobs is not None:
            logprobs.append(scores.reshape(-1)[out[-1]].item())
    return out


def _run(engine, requests: dict, logprobs: dict | None = None):
    """Submit `requests` (id -> (keyed ids, images)) together: tokens and usage of each
    (and into `logprobs`, those of the requests that asked)."""
    for rid, (ids, images) in requests.items():
        engine.add_request(rid, ids, SamplingParams(max_tokens=MAX_TOKENS), images=images)
    tokens, usage = {}, {}
    while engine.has_work():
        for delta in engine.step():
            assert delta.error is None, delta.error
            tokens.setdefault(delta.request_id, []).extend(delta.token_ids)
            if logprobs is not None and delta.logprobs:
                logprobs.setdefault(delta.request_id, []).extend(delta.logprobs)
            if delta.usage is not None:
                usage[delta.request_id] = delta.usage
    return tokens, usage


def test_greedy_with_an_image_equals_mlx_vlm_batched_with_text_and_chunked(loaded):
    image = sample_image(40, 60, seed=1)
    ids, keyed, images = _prompt(
        loaded, "what is the capital of france? ", image, " answer the user"
    )
    want_logprobs: list[float] = []
    want = _mlx_vlm_greedy(loaded, ids, image, want_logprobs)
    text_ids, _, _ = _prompt(loaded, "the quick brown fox jumps over the lazy dog", None, "")
    # 8-token chunks: the image's tokens straddle chunk boundaries
    engine = _engine(loaded, prefill_chunk=8, step_token_budget=24)
    assert engine.intake.vision is not None
    sampling = SamplingParams(max_tokens=MAX_TOKENS, logprobs=True)
    engine.add_request("img", keyed, sampling, images=images)
    seq = engine.scheduler.sequences_of("img")[0]
    logprobs: dict[str, list[float]] = {}
    tokens, usage = _run(engine, {"text": (text_ids, ())}, logprobs)
    assert tokens["img"] == want
    # the logprobs too: a tiny random model's greedy tokens can agree while its positions
    # are wrong (Qwen-VL's 3-D positions forced to the index: greedy agrees here, these not)
    np.testing.assert_allclose(logprobs["img"], want_logprobs, atol=1e-4)
    assert seq.images.encodings == 1  # once for the prompt, not once per chunk
    assert tokens["text"] == reference_greedy(loaded[2], text_ids, MAX_TOKENS)
    assert usage["img"].prompt_tokens == len(ids)
    engine.check_integrity()


def test_repeated_image_hits_the_cache_and_a_different_image_does_not(loaded):
    engine = _engine(loaded, prefill_chunk=16)
    image, other = sample_image(40, 60, seed=2), sample_image(40, 60, seed=3)
    before, after = "hello world, you are a helpful assistant; answer the user. ", " what is it?"
    ids, keyed, images = _prompt(loaded, before, image, after)
    first, usage = _run(engine, {"a": (keyed, images)})
    assert usage["a"].cached_tokens == 0
    again, usage = _run(engine, {"b": (keyed, images)})
    assert again["b"] == first["a"]
    assert usage["b"].cached_tokens >= len(ids) - 8  # all its whole blocks
    ids_other, keyed_other, images_other = _prompt(loaded, before, other, after)
    assert keyed_other != keyed
    first_key = next(i for i, (a, b) in enumerate(zip(keyed, keyed_other, strict=True)) if a != b)
    got, usage = _run(engine, {"c": (keyed_other, images_other)})
    assert usage["c"].cached_tokens <= first_key  # nothing past the image's first token
    assert got["c"] == _mlx_vlm_greedy(loaded, ids_other, other)
    engine.check_integrity()


def test_the_vision_tower_does_not_run_for_a_cached_image(loaded):
    engine = _engine(loaded, prefill_chunk=8)
    image = sample_image(40, 60, seed=4)
    ids, keyed, images = _prompt(loaded, "the quick brown fox ", image, " jumps over the lazy dog")
    _run(engine, {"a": (keyed, images)})
    engine.add_request("b", keyed, SamplingParams(max_tokens=2), images=images)
    seq = engine.scheduler.sequences_of("b")[0]
    while engine.has_work():
        engine.step()
    covered = max(seq.images.positions) < seq.num_cached
    assert covered and seq.images.encodings == 0


def test_images_refused_in_one_sentence(loaded, tmp_path):
    engine = _engine(loaded)
    image = sample_image(40, 60, seed=5)
    _, keyed, images = _prompt(loaded, "hello ", image, " world")
    with pytest.raises(InvalidRequest, match="image 0 could not be decoded"):
        engine.add_request(
            "bad", keyed, SamplingParams(), images=(ImageInput(b"nope", images[0].tokens),)
        )
    with pytest.raises(InvalidRequest, match="image keys"):
        engine.add_request("count", keyed, SamplingParams(), images=(ImageInput(image, 1),))
    with pytest.raises(InvalidRequest, match="image keys"):
        engine.add_request("missing", keyed, SamplingParams())
    if loaded[0] in QWEN:  # its resize refuses extreme aspect ratios
        with pytest.raises(InvalidRequest, match="aspect ratio"):
            engine.intake.vision.prepare((ImageInput(sample_image(1, 250), 4),))
    # a worker without the image side (a text model, or no extra) says why
    engine.intake.vision, engine.intake.vision_note = None, "this model does not take images"
    with pytest.raises(InvalidRequest, match="does not take images"):
        engine.add_request("text", keyed, SamplingParams(), images=images)
    assert not engine.has_work()


def test_the_image_keys_stand_for_pixels_not_file_bytes():
    png, bmp = sample_image(20, 20, seed=6, fmt="PNG"), sample_image(20, 20, seed=6, fmt="BMP")
    from io import BytesIO

    from PIL import Image

    hashes = {
        image_hash(img.tobytes(), "RGB", img.size)
        for img in (Image.open(BytesIO(b)).convert("RGB") for b in (png, bmp))
    }
    assert len(hashes) == 1
    keys = image_keys(hashes.pop(), 4)
    assert len(set(keys)) == 4 and all(k >= 1 << 30 for k in keys)
    assert np.all(np.array(keys) < 1 << 31)


def test_image_requests_in_a_tight_pool_preempted_and_resumed(loaded):
    # 10 blocks of 8 tokens: Mistral 3's batch outgrows them while it decodes (preempted,
    # resumed: the images embedded again); Gemma 3's window layers give back their pages
    # behind the window, so its batch fits, but its prompts share a partial tail block
    # whose window pages the admission must keep until copied (they were reused, and
    # outputs went wrong) and a lone prompt must be admitted in a chunk that fits (it
    # waited for ever)
    engine = _engine(loaded, num_blocks=10, max_running=4, prefill_chunk=16)
    requests, want = {}, {}
    for i in range(4):
        image = sample_image(40 + 8 * i, 60, seed=10 + i)
        ids, keyed, images = _prompt(
            loaded, f"the quick brown fox {i} ", image, " what is the capital of france?"
        )
        requests[f"r{i}"] = (keyed, images)
        want[f"r{i}"] = _mlx_vlm_greedy(loaded, ids, image)
    tokens, _ = _run(engine, requests)
    assert tokens == want
    assert engine.stats()["preemptions"] > 0 or loaded[0] == "gemma3"
    engine.check_integrity()


def test_mrope_at_index_positions_is_the_layers_own_rope(loaded):
    """Text rows batched with a Qwen-VL image prompt go through M-RoPE at index positions:
    the same rotation as the 1-D rope mlx-lm built the layer with."""
    if loaded[0] not in QWEN:
        pytest.skip("a 1-D rope family")
    from worker.attention import ForwardContext, building
    from worker.vision.mrope import MRoPE, forward_positions

    rope = _engine(loaded).runner.trunk.module.layers[0].self_attn.rope
    assert isinstance(rope, MRoPE)
    x = mx.random.normal((2, 4, 5, 16), key=mx.random.key(1))
    want = rope(x, offset=30)
    index = np.repeat(np.arange(30, 35)[None], 3, axis=0)
    offsets = mx.array([30, 30], dtype=mx.int32)
    with building(ForwardContext(offsets, forward_positions([30, 30], [index, None], 5))):
        got = rope(x, offset=30)
    np.testing.assert_allclose(np.array(got), np.array(want), atol=1e-5)
    image = np.stack([np.full(5, 30), np.arange(30, 35), np.arange(30, 35) % 2 + 30])
    with building(ForwardContext(offsets, forward_positions([30, 30], [image, None], 5))):
        moved = rope(x, offset=30)
    assert not np.allclose(np.array(moved[0]), np.array(want[0]), atol=1e-3)
    np.testing.assert_allclose(np.array(moved[1]), np.array(want[1]), atol=1e-5)


def test_each_choice_of_an_image_prompt_equals_mlx_vlm(loaded):
    # the choices fork off once the prompt (but its last token) is computed: each fork keeps
    # the images (Qwen-VL: the positions of its last prompt token and of every token after)
    engine = _engine(loaded, prefill_chunk=16)
    image = sample_image(48, 60, seed=20)
    ids, keyed, images = _prompt(loaded, "the quick brown fox ", image, " what is it?")
    want_logprobs: list[float] = []
    want = _mlx_vlm_greedy(loaded, ids, image, want_logprobs)
    sampling = SamplingParams(max_tokens=MAX_TOKENS, logprobs=True)
    engine.add_request("n", keyed, sampling, n=2, images=images)
    tokens: dict[int, list[int]] = {}
    logprobs: dict[int, list[float]] = {}
    while engine.has_work():
        for delta in engine.step():
            assert delta.error is None, delta.error
            tokens.setdefault(delta.index, []).extend(delta.token_ids)
            logprobs.setdefault(delta.index, []).extend(delta.logprobs or ())
    assert tokens == {0: want, 1: want}
    for choice in (0, 1):
        np.testing.assert_allclose(logprobs[choice], want_logprobs, atol=1e-4)
    engine.check_integrity()


def test_a_vision_tower_that_cannot_load_serves_text_and_says_why(loaded, tmp_path):
    """A checkpoint mlx-vlm cannot load (here: its weights file gone, after the language
    model was loaded) does not stop the worker: the text is served, and images are refused
    with the reason."""
    import shutil

    _, directory, model, tokenizer, _ = loaded
    broken = tmp_path / "broken"
    shutil.copytree(directory, broken)
    (broken / "model.safetensors").unlink()
    engine = make_engine(model).open_vision(broken, tokenizer)
    assert engine.intake.vision is None
    assert "vision tower could not be loaded" in engine.intake.vision_note
    _, keyed, images = _prompt(loaded, "hello ", sample_image(seed=8), " world")
    with pytest.raises(InvalidRequest, match="could not be loaded"):
        engine.add_request("img", keyed, SamplingParams(), images=images)
    text, _, _ = _prompt(loaded, "hello world", None, "")
    assert _run(engine, {"t": (text, ())})[0]["t"] == reference_greedy(model, text, MAX_TOKENS)


def test_a_failed_image_fails_only_its_own_request(loaded, monkeypatch):
    """The vision tower raising on one prompt's images, in a step it shares with another
    image prompt and a text prompt: that request ends with an error, the others go on and
    stay greedy-equal to mlx-vlm and mlx-lm."""
    engine = _engine(loaded)
    good, bad = sample_image(40, 60, seed=20), sample_image(40, 60, seed=21)
    ids, keyed, images = _prompt(loaded, "the quick brown fox ", good, " jumps over")
    _, keyed_bad, images_bad = _prompt(loaded, "the quick brown fox ", bad, " jumps over")
    text_ids, _, _ = _prompt(loaded, "hello world, answer the user", None, "")
    encode = engine.intake.vision.encode

    def tower(token_ids, pixels):
        if token_ids == keyed_bad:
            raise RuntimeError("the tower broke on this one")
        return encode(token_ids, pixels)

    monkeypatch.setattr(engine.intake.vision, "encode", tower)
    sampling = SamplingParams(max_tokens=MAX_TOKENS)
    engine.add_request("good", keyed, sampling, images=images)
    engine.add_request("bad", keyed_bad, sampling, images=images_bad)
    engine.add_request("text", text_ids, sampling)
    tokens: dict[str, list[int]] = {}
    errors = {}
    while engine.has_work():
        deltas = engine.step()
        for delta in deltas:
            if delta.error is not None:
                errors[delta.request_id] = delta.error
                # the others were in that step: their first tokens came with the error
                assert {d.request_id for d in deltas if d.token_ids} == {"good", "text"}
            tokens.setdefault(delta.request_id, []).extend(delta.token_ids)
    assert list(errors) == ["bad"] and "the tower broke on this one" in errors["bad"]
    assert "vision tower" in errors["bad"]
    assert tokens["good"] == _mlx_vlm_greedy(loaded, ids, good)
    assert tokens["text"] == reference_greedy(loaded[2], text_ids, MAX_TOKENS)
    assert not tokens["bad"]
    engine.check_integrity()


def test_rope_index_in_numpy_equals_mlx_vlm(loaded):
    """The M-RoPE positions computed off the engine thread (numpy) are mlx-vlm's own, for a
    prompt with two images of different grids between texts."""
    if loaded[0] not in QWEN:
        pytest.skip("a 1-D rope family")
    engine = _engine(loaded)
    vision = engine.intake.vision
    first, second = sample_image(40, 60, seed=30), sample_image(90, 30, seed=31)
    _, keyed_a, images_a = _prompt(loaded, "one ", first, " two ")
    _, keyed_b, images_b = _prompt(loaded, "", second, " three four")
    keyed, images = keyed_a + keyed_b, images_a + images_b
    prepared = vision.prepare_prompt(keyed, images)
    _, real = vision._real_ids(keyed)
    want, delta = vision.model.language_model.get_rope_index(
        mx.array(real[None], dtype=mx.int32),
        mx.array(prepared.pixels.extras["image_grid_thw"]),
    )
    np.testing.assert_array_equal(prepared.rope[0], np.array(want[:, 0]))
    assert prepared.rope[1] == delta.reshape(-1)[0].item() != 0
