"""Image requests through the worker loop (issue 41): their images are decoded, preprocessed
and placed (M-RoPE) on the preparer's threads, never on the loop's (the engine thread); a bad
image fails its request alone; an abort while it is prepared drops it."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("mlx_vlm")

from shared.models.loading import load_model  # noqa: E402
from shared.models.vision import vision_spec  # noqa: E402
from shared.protocol import Abort, Generate, ImageInput, Register, RegisterAck, TokenDelta  # noqa: E402
from shared.sampling import SamplingParams  # noqa: E402
from tests.support.arch_zoo.vision import build_vision_model, image_prompt, sample_image  # noqa: E402
from tests.support.engine_fixtures import make_engine, reference_greedy  # noqa: E402
from tests.support.kv_router import FakeRouter  # noqa: E402
from worker.loop import WorkerLoop  # noqa: E402

MAX_TOKENS = 6


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    """Qwen2-VL: its images also get a rope index, the host work that read device arrays."""
    directory = build_vision_model("qwen2_vl", tmp_path_factory.mktemp("qwen2_vl"))
    model, tokenizer = load_model(directory, "float32")
    return directory, model, tokenizer, vision_spec(directory, tokenizer.convert_ids_to_tokens)


def _engine(qwen):
    directory, model, tokenizer, _ = qwen
    return make_engine(model).open_vision(directory, tokenizer)


class Recorder:
    """Wraps the vision side's host work, recording the thread each call ran on; `gate`
    holds preparation until set."""

    def __init__(self, vision):
        self.threads: list[int] = []
        self.gate = threading.Event()
        self.gate.set()
        for name in ("prepare", "rope_index", "prepare_prompt"):
            setattr(vision, name, self._wrap(getattr(vision, name)))

    def _wrap(self, fn):
        def recorded(*args):
            self.threads.append(threading.get_ident())
            self.gate.wait(10)
            return fn(*args)

        return recorded


@pytest.fixture
def running(qwen):
    engine = _engine(qwen)
    recorder = Recorder(engine.intake.vision)
    router = FakeRouter()
    server = WorkerLoop(engine, router.endpoint, "w-img", "tiny-vl")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    router.recv_until(Register)
    router.send(RegisterAck(accepted=True, heartbeat_interval_s=0.1))
    yield router, recorder, thread
    server.stop()
    thread.join(timeout=5)
    router.close()


def _collect(router, ids: set[str]) -> dict[str, tuple[list[int], TokenDelta]]:
    out: dict[str, tuple[list[int], TokenDelta]] = {}
    while len(out) < len(ids) or any(d is None for _, d in out.values()):
        msg = router.recv_until(TokenDelta)
        tokens, _ = out.setdefault(msg.request_id, ([], None))
        tokens.extend(msg.token_ids)
        out[msg.request_id] = (tokens, msg if msg.finish_reason else None)
    return out


def test_images_are_prepared_off_the_loop_thread_and_a_bad_one_fails_alone(running, qwen):
    router, recorder, loop_thread = running
    _, model, tokenizer, spec = qwen
    image = sample_image(40, 60, seed=40)
    _, keyed, images = image_prompt(tokenizer, spec, "the quick brown fox ", image, " jumps")
    text_ids, _, _ = image_prompt(tokenizer, spec, "hello world, answer the user", None, "")
    bad = (ImageInput(b"not an image", images[0].tokens),)
    sampling = SamplingParams(max_tokens=MAX_TOKENS)
    router.send(Generate("good", tuple(keyed), sampling, images=images))
    router.send(Generate("bad", tuple(keyed), sampling, images=bad))
    router.send(Generate("text", tuple(text_ids), sampling))
    out = _collect(router, {"good", "bad", "text"})
    assert out["bad"][1].finish_reason == "error"
    assert "image 0 could not be decoded" in out["bad"][1].error
    assert out["text"][0] == reference_greedy(model, text_ids, MAX_TOKENS)
    alone = _engine(qwen)  # the same request straight into an engine (equal to mlx-vlm there)
    alone.add_request("good", keyed, sampling, images=images)
    want = []
    while alone.has_work():
        want += [t for d in alone.step() for t in d.token_ids]
    assert out["good"][0] == want and out["good"][1].finish_reason == "length"
    # decoding, the processor and the rope index ran, and never on the engine's thread
    assert len(recorder.threads) >= 5  # good: prepare_prompt, prepare, rope_index; bad: two
    assert loop_thread.ident not in recorder.threads


def test_a_request_aborted_while_its_images_are_prepared_never_runs(running, qwen):
    router, recorder, _ = running
    _, model, tokenizer, spec = qwen
    image = sample_image(40, 60, seed=41)
    _, keyed, images = image_prompt(tokenizer, spec, "the quick brown fox ", image, " jumps")
    recorder.gate.clear()  # held in preparation
    sampling = SamplingParams(max_tokens=MAX_TOKENS)
    router.send(Generate("gone", tuple(keyed), sampling, images=images))
    router.send(Abort("gone"))
    text_ids = list(range(3, 20))
    router.send(Generate("after", tuple(text_ids), sampling))  # the loop goes on meanwhile
    out = _collect(router, {"after"})
    assert out["after"][0] == reference_greedy(model, text_ids, MAX_TOKENS)
    recorder.gate.set()
    router.send(Generate("last", tuple(text_ids), SamplingParams(max_tokens=1)))
    out = _collect(router, {"last"})  # nothing of "gone" came first
    assert set(out) == {"last"}
