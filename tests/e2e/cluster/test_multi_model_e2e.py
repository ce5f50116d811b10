"""Two models in one fleet, real processes: the default model and a random tiny llama written to
a temp dir, started by launch-cluster from a [[models]] config, one worker each. Requests are
routed by name (or alias), each model's second request hits its own worker's prefix cache, an
unknown model is a 404 that lists both. And architectures without a vision side or a child
named `embed_tokens` served as workers do: gpt2-, gpt_neox- and olmo2-shaped tiny directories
in one launch-cluster, each answering greedy-equal to mlx-lm on the same directory."""

from __future__ import annotations

import urllib.error
import urllib.request

import openai
import pytest
from mlx_lm import load
from transformers import AutoTokenizer

from tests.support.arch_zoo.saved import save
from tests.support.engine_fixtures import reference_greedy
from tests.support.launched import get_json, launch_cluster, wait_for_models
from tests.support.tp_group import save_tiny_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def url(default_model_dir, tmp_path_factory):
    tiny = save_tiny_model(tmp_path_factory.mktemp("tiny-random") / "tiny-random", seed=3)
    work = tmp_path_factory.mktemp("two-models")
    config = work / "fleet.toml"
    config.write_text(
        f'[[models]]\npath = "{default_model_dir}"\nid = "smol"\naliases = ["small"]\n'
        f'[[models]]\npath = "{tiny}"\n'
    )
    args = ["--config", str(config), "--workers", "1", "--kv-memory", "128MiB"]
    with launch_cluster(args, work) as (base, _):
        wait_for_models(base, {"smol": 1, "tiny-random": 1})
        yield base


def test_two_models_served_at_once_routed_by_name_with_their_own_caches(url):
    api = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    assert [m.id for m in api.models.list()] == ["smol", "tiny-random"]
    workers = {w["id"]: w["model"] for w in get_json(f"{url}/v1/cluster")["workers"]}
    assert sorted(workers.values()) == ["smol", "tiny-random"]
    # a prompt of several blocks, the same text for both models
    prompt = "You are a careful assistant for a team of engineers. " * 12
    prompt_tokens = {}
    for name, served in (("smol", "smol"), ("tiny-random", "tiny-random"), ("small", "smol")):
        first = api.completions.create(model=name, prompt=prompt, max_tokens=4, temperature=0)
        again = api.completions.create(model=name, prompt=prompt, max_tokens=4, temperature=0)
        assert first.model == again.model == served
        assert again.usage.prompt_tokens_details.cached_tokens > 0, name
        assert again.choices[0].text == first.choices[0].text  # greedy: the same model answered
        prompt_tokens[served] = first.usage.prompt_tokens
    served = {w["model"]: w["requests_served"] for w in get_json(f"{url}/v1/cluster")["workers"]}
    assert served == {"smol": 4, "tiny-random": 2}
    # each model's own tokenizer read the prompt (the tiny one has 400 tokens, SmolLM2 49k)
    assert prompt_tokens["tiny-random"] > prompt_tokens["smol"]


def test_unknown_model_is_a_404_listing_both(url):
    api = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.NotFoundError) as caught:
        api.completions.create(model="gpt-9", prompt="hi", max_tokens=1)
    message = caught.value.body["message"]
    assert "'smol'" in message and "'tiny-random'" in message
    try:
        urllib.request.urlopen(f"{url}/v1/models/gpt-9", timeout=5)
    except urllib.error.HTTPError as e:
        assert e.code == 404
    else:
        raise AssertionError("GET /v1/models/gpt-9 was not a 404")


# ---- architectures as workers: tiny directories (random weights, a word-level tokenizer:
# tests/support/arch_zoo/saved.py). gpt2 and gpt_neox died at load while the worker opened
# the vision side; olmo itself is not built here (its mlx-lm module imports ai2-olmo), olmo2
# is its nearest shape.

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
