"""Several prompts in one /v1/completions request (what batch clients send), through the
openai SDK with stand-in workers: each prompt with n choices, indexed prompt x n + choice as
OpenAI does, whole and streamed, spread over workers, usage added up."""

from __future__ import annotations

import openai
import pytest

MODEL = "tiny"


@pytest.fixture
async def cluster(make_cluster):
    cluster = await make_cluster()
    await cluster.add_worker("w1")
    await cluster.add_worker("w2")
    return cluster


def _expected_text(cluster, prompt_ids, choice, max_tokens):
    """The stand-in worker's text: choice i walks its alphabet from len(prompt) + i."""
    alphabet = cluster.workers["w1"][0].config.alphabet
    start = len(prompt_ids) + choice
    tokens = [alphabet[(start + j) % len(alphabet)] for j in range(max_tokens)]
    return cluster.tokenizer.decode(tokens)


PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12], [1, 2]]


@pytest.mark.parametrize("n", [1, 2])
async def test_token_id_prompts_whole(cluster, n):
    api = cluster.openai()
    resp = await api.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=3, n=n)
    assert [c.index for c in resp.choices] == list(range(len(PROMPTS) * n))
    for c in resp.choices:
        prompt, choice = divmod(c.index, n)
        assert c.text == _expected_text(cluster, PROMPTS[prompt], choice, 3)
        assert c.finish_reason == "length"
    assert resp.usage.prompt_tokens == sum(len(p) for p in PROMPTS)
    assert resp.usage.completion_tokens == 3 * n * len(PROMPTS)
    received = [m for w in ("w1", "w2") for m in cluster.workers[w][0].received]
    assert sorted(len(m.token_ids) for m in received) == sorted(len(p) for p in PROMPTS)
    assert all(m.n == n for m in received)


async def test_string_prompts_streamed_go_to_different_workers(cluster):
    api = cluster.openai()
    prompts = ["the first prompt", "a second, longer prompt here", "third"]
    stream = await api.completions.create(
        model=MODEL,
        prompt=prompts,
        max_tokens=4,
        n=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    texts: dict[int, str] = {}
    finished = set()
    usage = None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason:
                finished.add(c.index)
    assert finished == set(range(6))
    for index, text in texts.items():
        prompt, choice = divmod(index, 2)
        ids = cluster.tokenizer.encode_prompt(prompts[prompt])
        assert text == _expected_text(cluster, ids, choice, 4)
    assert usage.completion_tokens == 24
    served = {w for w in ("w1", "w2") if cluster.workers[w][0].received}
    assert served == {"w1", "w2"}  # balanced: the prompts spread


@pytest.mark.parametrize(
    "prompt",
    [[], ["ok", ""], ["ok", 5], [[1, 2], [10**7]], ["x"] * 65, [[1], "a", [2, "b"]]],
)
async def test_bad_batches_are_a_400(cluster, prompt):
    api = cluster.openai()
    with pytest.raises(openai.BadRequestError) as e:
        await api.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
    assert e.value.body["param"] == "prompt"
