"""prompt_cache_key as a routing affinity key, with stand-in workers: same key, different
prompts -> the same worker while loads are balanced; the load guard still moves it."""

from __future__ import annotations

import asyncio
import random

from router.routing.policy import CacheAwarePolicy, Candidate

MODEL = "tiny"


def _prompt(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 300) for _ in range(rng.randrange(6, 30))]


def _served_by(cluster) -> dict[str, str]:
    """request id -> the worker it was sent to."""
    return {
        msg.request_id.split("#")[0]: worker_id
        for worker_id, (worker, _) in cluster.workers.items()
        for msg in worker.received
    }


async def _complete(api, prompt, key=None, max_tokens=2):
    extra = {"prompt_cache_key": key} if key is not None else None
    resp = await api.completions.create(
        model=MODEL, prompt=prompt, max_tokens=max_tokens, extra_body=extra
    )
    return resp.id


async def test_same_key_different_prompts_go_to_one_worker(make_cluster):
    cluster = await make_cluster()
    for w in ("w1", "w2", "w3"):
        await cluster.add_worker(w)
    api = cluster.openai()
    keyed = {
        key: [await _complete(api, _prompt(i * 7 + k), key) for i in range(6)]
        for k, key in enumerate(["tenant-a", "tenant-b", "tenant-c"])
    }
    unkeyed = [await _complete(api, _prompt(100 + i)) for i in range(6)]
    served = _served_by(cluster)
    homes = {key: {served[i] for i in ids} for key, ids in keyed.items()}
    assert all(len(workers) == 1 for workers in homes.values()), homes
    # new keys are spread like any request (the policy's turn among equal costs)...
    assert len(set().union(*homes.values())) > 1
    # ...and without a key, different prompts do spread: the key is what kept them together
    assert len({served[i] for i in unkeyed}) > 1


async def test_the_load_guard_moves_a_key_off_an_overloaded_worker(make_cluster):
    cluster = await make_cluster(balance_abs_threshold=2, balance_rel_threshold=1.0)
    for w in ("w1", "w2"):
        await cluster.add_worker(w, token_delay_s=0.05)
    api = cluster.openai()
    first = await _complete(api, _prompt(1), "hot")
    home = _served_by(cluster)[first]
    # six long requests with the key at once: the home worker takes them until its load is
    # more than 2 over the other's, then the guard sends the rest away
    ids = await asyncio.gather(*(_complete(api, _prompt(10 + i), "hot", 12) for i in range(6)))
    served = _served_by(cluster)
    at_home = [i for i in ids if served[i] == home]
    assert 3 <= len(at_home) < 6


def test_policy_prefers_the_keyed_worker_within_the_guard():
    policy = CacheAwarePolicy(prefill_weight=1.0, balance_abs_threshold=4)
    a = Candidate("a", load=0, matched_blocks=0, prompt_blocks=8)
    b = Candidate("b", load=2, matched_blocks=0, prompt_blocks=8, affinity=True, keyed=True)
    assert policy.choose([a, b]).worker_id == "b"  # 2 busier, but the key's home
    busy = b._replace(load=5)
    assert policy.choose([a, busy]).worker_id == "a"  # 5 - 0 > 4: the guard moves it
