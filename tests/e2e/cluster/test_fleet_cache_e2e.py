"""The fleet as one cache (issue 22), end to end through launch-cluster and the openai client:
a disaggregated cluster (1 prefill + 1 decode worker) answers what a single worker answers,
the decoder having pulled the prefill worker's blocks; and in a 2-worker cluster a returning
prompt whose holder is busy goes to the idle worker, which pulls the prefix and answers the
same greedy output."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import openai
import pytest

from tests.support.launched import PIPED, launch_cluster, wait_for
from tests.support.tp_group import save_tiny_model

pytestmark = pytest.mark.slow

# ~230 tokens with the tiny model's tokenizer: many 8-token blocks to hand over
LONG = "The fleet keeps long agent sessions warm across machines. " * 4


def cluster_state(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/v1/cluster", timeout=5) as r:
        return json.loads(r.read())


def wait_workers(url: str, count: int, timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = cluster_state(url)
            if sum(bool(w["healthy"] and w.get("kv_endpoint")) for w in state["workers"]) >= count:
                return state
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"fewer than {count} healthy workers with a KV endpoint in {timeout}s")


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)


def greedy(c: openai.OpenAI, content: str, max_tokens: int = 12) -> str:
    model = c.models.list().data[0].id
    messages = [{"role": "user", "content": content}]
    r = c.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=max_tokens
    )
    return r.choices[0].message.content


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-fleet", seed=3)


def test_disaggregated_cluster_answers_what_one_worker_answers(tiny, tmp_path):
    common = ["--model", str(tiny), "--block-size", "8", "--kv-memory", "16MiB"]
    question = LONG + "What is kept warm?"
    # every prompt through the prefill worker, however short (the default skips those with
    # fewer than 256 uncached tokens: a decoder computes them in about one chunk)
    config = tmp_path / "fleet.toml"
    config.write_text("[router]\nprefill_min_tokens = 0\n")
    args = [*common, "--config", str(config), "--prefill-workers", "1", "--workers", "1"]
    # both clusters start at once (they share nothing: ports, logs and stores are their own),
    # so their startups overlap
    with (
        launch_cluster([*common, "--workers", "1"], tmp_path / "one", **PIPED) as (one, _),
        launch_cluster(args, tmp_path / "disagg", **PIPED) as (url, _),
    ):
        wait_workers(one, 1)
        expected = greedy(client(one), question)
        state = wait_workers(url, 2)
        roles = {w["id"]: w["role"] for w in state["workers"]}
        assert sorted(roles.values()) == ["decode", "prefill"]
        assert greedy(client(url), question) == expected
        decoder = next(w for w, role in roles.items() if role == "decode")

        def pulled() -> int:
            workers = {w["id"]: w for w in cluster_state(url)["workers"]}
            return workers[decoder]["pulled_blocks"]

        # the decoder computed nothing of the prompt's full blocks: it pulled them
        assert wait_for(pulled) >= 20
        cache = cluster_state(url)["cache"]
        assert cache["pulled_tokens"] >= 20 * 8


def test_a_busy_holder_loses_its_prompt_to_an_idle_worker_that_pulls_it(model_cache, tmp_path):
    """What this forces: the default model (a ~900-token prompt costs seconds to prefill here,
    a loopback pull a fraction of that) on 2 workers under cache_aware. Prompt P is served
    once (its worker becomes the holder); a request sharing P's prefix, with a long output,
    follows it to the holder (its cache) and keeps it busy; an unrelated long prompt Q then
    goes to the idle worker (the holder has a request more of load), which so measures its
    prefill rate (until it has, the router assumes a high one and never prices a pull in).
    P sent again while the holder still streams costs the holder a request of load and the
    idle worker only the pull (prefill_weight x blocks x pull/recompute), so it goes to the
    idle worker, which pulls P's blocks and must answer what the holder answered."""
    words = "The fleet keeps long agent sessions warm across machines and restarts. "
    prefix = words * 60  # ~900 tokens
    args = ["--workers", "2", "--kv-memory", "256MiB"]
    with launch_cluster(args, tmp_path, **PIPED) as (url, _):
        wait_workers(url, 2)
        c = client(url)
        first = greedy(c, prefix + "What is kept warm?")
        served = {w["id"]: w["requests_served"] for w in cluster_state(url)["workers"]}
        holder = next(w for w, n in served.items() if n == 1)
        other = next(w for w in served if w != holder)
        # the link measured (one way stands for both) before the prompt returns
        wait_for(lambda: any(w["links"] for w in cluster_state(url)["workers"]), timeout=30)

        busy_started = threading.Event()

        def busy() -> None:
            model = c.models.list().data[0].id
            messages = [{"role": "user", "content": prefix + "Tell a long story."}]
            stream = c.chat.completions.create(
                model=model, messages=messages, temperature=0, max_tokens=400, stream=True
            )
            try:
                for _ in stream:
                    busy_started.set()
            except openai.APIError:  # the cluster stopped under it at the test's end
                pass

        thread = threading.Thread(target=busy, daemon=True)
        thread.start()
        assert busy_started.wait(120)
        workers = {w["id"]: w for w in cluster_state(url)["workers"]}
        assert workers[holder]["inflight"] == 1, "the busy request went to the holder"
        # Q: ~790 tokens, as many as P (upper case takes twice the tokens: 60 repeats were
        # 1,680), so the rate it measures is the one that prices recomputing P
        greedy(c, words.upper() * 28 + "What else?", max_tokens=2)
        workers = {w["id"]: w for w in cluster_state(url)["workers"]}
        assert workers[other]["requests_served"] == served[other] + 1, "Q went to the idle one"
        # its heartbeat no longer counts Q as running (the router takes the larger of that
        # and its own in-flight count as a worker's load)
        wait_for(lambda: {w["id"]: w["load"] for w in cluster_state(url)["workers"]}[other] == 0)
        assert workers[holder]["inflight"] == 1, "the holder is still busy"
        again = greedy(c, prefix + "What is kept warm?")
        workers = {w["id"]: w for w in cluster_state(url)["workers"]}
        links = {w: (s["links"], s["prefill_tokens_per_s"]) for w, s in workers.items()}
        assert workers[other]["requests_served"] == served[other] + 2, f"P stayed: {links}"
        assert again == first
        assert wait_for(lambda: cluster_state(url)["cache"]["pulled_tokens"]) > 0
        pulled = {w["id"]: w["pulled_blocks"] for w in cluster_state(url)["workers"]}
        assert pulled[other] > 0 and pulled[holder] == 0
