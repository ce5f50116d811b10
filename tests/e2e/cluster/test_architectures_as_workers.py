"""Architectures without a vision side, and without a child named `embed_tokens`, served as
workers do: gpt2-, gpt_neox- and olmo2-shaped tiny directories (random weights, a word-level
tokenizer: tests/support/arch_zoo/saved.py) in one launch-cluster from a [[models]] config, one
worker each, each answering a completion greedy-equal to mlx-lm on the same directory.

(gpt2 and gpt_neox died at load while the worker opened the vision side; olmo itself cannot be
built here: its mlx-lm module imports the ai2-olmo package. olmo2 is its nearest shape.)"""

from __future__ import annotations

import openai
import pytest
from mlx_lm import load
from transformers import AutoTokenizer

from tests.support.arch_zoo.saved import save
from tests.support.engine_fixtures import reference_greedy
from tests.support.launched import launch_cluster, wait_for_models

pytestmark = pytest.mark.slow

ARCHITECTURES = ("gpt2", "gpt_neox", "olmo2")
PROMPT = "w11 w23 w5 w42 w17 w9 w88 w31 w64 w7 w50 w12"
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    work = tmp_path_factory.mktemp("architectures")
    dirs = {arch: save(arch, work / arch, seed=i) for i, arch in enumerate(ARCHITECTURES)}
    config = work / "fleet.toml"
    config.write_text("".join(f'[[models]]\npath = "{d}"\n' for d in dirs.values()))
    args = ["--config", str(config), "--workers", "1", "--kv-memory", "16MiB"]
    with launch_cluster(args, work / "logs") as (base, proc):
        try:
            wait_for_models(base, dict.fromkeys(ARCHITECTURES, 1), timeout=240)
        except AssertionError:
            logs = sorted((work / "logs").glob("*"))
            tails = "\n".join(f"---- {p.name}\n{p.read_text()[-2000:]}" for p in logs)
            raise AssertionError(
                f"workers did not register (exit {proc.poll()}):\n{tails}"
            ) from None
        yield base, dirs


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_each_architecture_answers_as_mlx_lm_does(fleet, arch):
    base, dirs = fleet
    api = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)
    reply = api.completions.create(model=arch, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0)
    tokenizer = AutoTokenizer.from_pretrained(dirs[arch])
    prompt_ids = tokenizer.encode(PROMPT)
    want = reference_greedy(load(str(dirs[arch]))[0], prompt_ids, MAX_TOKENS)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    want = want[: want.index(eos)] if eos in want else want
    assert reply.model == arch
    assert reply.usage.prompt_tokens == len(prompt_ids)
    assert reply.usage.completion_tokens == len(want) or reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].text == tokenizer.decode(want)
