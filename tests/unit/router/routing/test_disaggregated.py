"""Disaggregated prefill and decode with stand-in workers over real ZeroMQ sockets."""

from __future__ import annotations

from shared.protocol import PullHint

MODEL = "tiny"
PROMPT = [60 + i % 200 for i in range(42)]  # 10 full blocks of 4, and 2 tokens
ALPHABET = tuple(range(50, 60))


def expected(n: int) -> list[int]:
    return [ALPHABET[(len(PROMPT) + i) % len(ALPHABET)] for i in range(n)]


def role(name: str, **more) -> dict:
    return {"role": name, "kv_endpoint": f"tcp://127.0.0.1:1900{len(name)}", **more}


async def test_prefill_worker_then_the_decoder_pulls_from_it(make_cluster):
    cluster = await make_cluster(prefill_min_tokens=0)
    p = await cluster.add_worker("p", **role("prefill"))
    d = await cluster.add_worker("d", **role("decode"))
    api = cluster.openai()
    stream = await api.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, stream=True)
    chunks = [c async for c in stream]
    assert [m.prefill_only for m in p.received] == [True]
    assert [m.prefill_only for m in d.received] == [False]
    assert d.received[0].pull == PullHint("p", p.config.kv_endpoint, 10)
    assert d.received[0].token_ids == tuple(PROMPT)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == cluster.tokenizer.decode(expected(3))
    assert chunks[-1].choices[0].finish_reason == "length"


async def test_failed_prefill_the_decoder_recomputes(make_cluster):
    cluster = await make_cluster(prefill_min_tokens=0)
    p = await cluster.add_worker("p", **role("prefill", prefill_error="out of memory"))
    d = await cluster.add_worker("d", **role("decode"))
    api = cluster.openai()
    resp = await api.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2)
    assert len(p.received) == 1 and len(d.received) == 1
    assert d.received[0].pull is None
    assert resp.choices[0].text == cluster.tokenizer.decode(expected(2))


async def test_prefill_timeout_the_decoder_recomputes(make_cluster):
    cluster = await make_cluster(prefill_timeout_s=0.3, prefill_min_tokens=0)
    p = await cluster.add_worker("p", **role("prefill", silent=True))
    d = await cluster.add_worker("d", **role("decode"))
    resp = await cluster.openai().completions.create(model=MODEL, prompt=PROMPT, max_tokens=2)
    assert resp.choices[0].text == cluster.tokenizer.decode(expected(2))
    assert d.received[0].pull is None
    await cluster.wait_until(lambda: p.aborted == [p.received[0].request_id])


async def test_prefill_worker_lost_the_decoder_recomputes(make_cluster):
    cluster = await make_cluster(prefill_min_tokens=0)
    p = await cluster.add_worker("p", **role("prefill", silent=True))
    d = await cluster.add_worker("d", **role("decode"))
    pending = cluster.dispatcher.start("r1", PROMPT, _sampling(2))
    await cluster.wait_until(lambda: len(p.received) == 1)
    await cluster.kill_worker("p")
    await cluster.wait_until(lambda: pending.finished, timeout=5)
    assert d.received[0].pull is None and pending.generated == expected(2)


async def test_decoders_never_prefill_and_prefill_workers_never_decode(make_cluster):
    cluster = await make_cluster(prefill_min_tokens=0)
    p = await cluster.add_worker("p", **role("prefill"))
    both = await cluster.add_worker("b", **role("both"))
    d = await cluster.add_worker("d", **role("decode"))
    api = cluster.openai()
    for i in range(4):
        await api.completions.create(model=MODEL, prompt=[i, *PROMPT], max_tokens=1)
    assert len(p.received) == 4 and all(m.prefill_only for m in p.received)
    decoded = both.received + d.received
    assert len(decoded) == 4 and not any(m.prefill_only for m in decoded)
    assert all(m.pull is not None and m.pull.worker_id == "p" for m in decoded)


async def test_a_fleet_of_both_workers_never_prefills_apart(make_cluster):
    cluster = await make_cluster(prefill_min_tokens=0)
    a = await cluster.add_worker("a", **role("both"))
    await cluster.openai().completions.create(model=MODEL, prompt=PROMPT, max_tokens=1)
    assert [(m.prefill_only, m.pull) for m in a.received] == [(False, None)]


def _sampling(max_tokens: int):
    from shared.sampling import SamplingParams

    return SamplingParams(max_tokens=max_tokens)


async def test_a_short_prompt_skips_the_prefill_leg(make_cluster):
    """The default prefill_min_tokens (256): a 42-token prompt goes straight to the decoder,
    and so does one whose prefix the decoder holds, leaving fewer uncached tokens than that."""
    cluster = await make_cluster()
    p = await cluster.add_worker("p", **role("prefill"))
    d = await cluster.add_worker("d", **role("decode"))
    resp = await cluster.openai().completions.create(model=MODEL, prompt=PROMPT, max_tokens=2)
    assert resp.choices[0].text == cluster.tokenizer.decode(expected(2))
    assert p.received == [] and [m.pull for m in d.received] == [None]
    cluster = await make_cluster(prefill_min_tokens=40)
    p = await cluster.add_worker("p", **role("prefill"))
    d = await cluster.add_worker("d", **role("decode"))
    await cluster.openai().completions.create(model=MODEL, prompt=PROMPT, max_tokens=1)
    assert len(p.received) == 1  # 42 uncached tokens: through the prefill worker
