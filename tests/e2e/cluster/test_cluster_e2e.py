"""End to end: `launch-cluster --workers 2` on the default model, real processes and sockets,
driven by the official openai client."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request

import openai
import pytest

from tests.support.launched import PIPED, launch_cluster

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def post(url: str, body: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


class Cluster:
    def __init__(self, url: str, proc: subprocess.Popen):
        self.url, self.proc = url, proc
        self.client = openai.OpenAI(
            base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120
        )

    def state(self) -> dict:
        return get_json(f"{self.url}/v1/cluster")

    def workers(self) -> dict[str, dict]:
        return {w["id"]: w for w in self.state()["workers"]}

    def wait_healthy(self, count: int, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if sum(w["healthy"] for w in self.state()["workers"]) >= count:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"fewer than {count} healthy workers after {timeout}s")


@pytest.fixture(scope="module")
def cluster(model_cache, tmp_path_factory):
    logs = tmp_path_factory.mktemp("cluster-logs")
    try:
        args = ["--workers", "2", "--kv-memory", "256MiB"]
        with launch_cluster(args, logs, **PIPED) as (base, proc):
            c = Cluster(base, proc)
            c.wait_healthy(2, timeout=300)
            yield c
    finally:  # the processes' logs, whatever happened
        for log in logs.iterdir():
            print(f"---- {log.name}\n{log.read_text()[-3000:]}")


def greedy_reference(question: list[dict], max_tokens: int) -> str:
    from mlx_lm import generate

    from shared.models.loading import load_model
    from shared.models.store import resolve_model

    model, tok = load_model(resolve_model(None))
    prompt = tok.apply_chat_template(question, add_generation_prompt=True, tokenize=False)
    return generate(model, tok, prompt, max_tokens=max_tokens)


def test_chat_completion_non_streaming(cluster):
    r = cluster.client.chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=24
    )
    assert "Paris" in r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens > 20 and r.usage.completion_tokens > 0


def test_cluster_view_shows_attention_choice_and_phases(cluster):
    cluster.client.chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=8
    )
    deadline = time.monotonic() + 10
    while True:
        workers = list(cluster.workers().values())
        phases = [w["phases"] for w in workers if w["phases"]]
        if any(p["prefill_tokens"] > 0 for p in phases) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    for w in workers:
        assert w["attention"]["backend"] == "mlx"  # no Metal on Linux
        assert w["attention"]["self_test"].startswith("not run:")
    assert any(p["prefill_tokens"] > 0 and p["prefill_chunk_p50_ms"] > 0 for p in phases)
    with urllib.request.urlopen(f"{cluster.url}/metrics", timeout=10) as r:
        metrics = r.read().decode()
    assert 'mlx_fleet_worker_attention_info{backend="mlx",' in metrics
    assert 'mlx_fleet_worker_phase_decode_tick_p95_ms{worker="worker-0"}' in metrics


def test_n_choices_fork_on_the_worker(cluster):
    r = cluster.client.chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=12, n=2
    )
    assert [c.index for c in r.choices] == [0, 1]
    expected = greedy_reference(QUESTION, 12)
    assert [c.message.content for c in r.choices] == [expected, expected]
    single = cluster.client.chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=12
    )
    assert r.usage.prompt_tokens == single.usage.prompt_tokens
    assert r.usage.completion_tokens == 2 * single.usage.completion_tokens


def test_greedy_output_equals_mlx_lm(cluster):
    r = cluster.client.chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=24
    )
    assert r.choices[0].message.content == greedy_reference(QUESTION, 24)


def test_chat_completion_streaming(cluster):
    stream = cluster.client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        temperature=0,
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" in text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_text_completions(cluster):
    r = cluster.client.completions.create(
        model=MODEL, prompt="The capital of France is", temperature=0, max_tokens=8
    )
    assert r.choices[0].text.strip()
    stream = cluster.client.completions.create(
        model=MODEL, prompt="The capital of France is", temperature=0, max_tokens=8, stream=True
    )
    assert "".join(c.choices[0].text for c in stream if c.choices) == r.choices[0].text


def test_shared_prefix_hits_the_cache_on_the_same_worker(cluster):
    system = " ".join(f"Guideline {i}: be accurate and kind about subject {i}." for i in range(40))
    before = {wid: w["requests_served"] for wid, w in cluster.workers().items()}
    usages = []
    for q in ("What is 2 plus 2?", "Name a color."):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": q}]
        r = cluster.client.chat.completions.create(
            model=MODEL, messages=messages, temperature=0, max_tokens=4
        )
        usages.append(r.usage)
    assert usages[1].prompt_tokens_details.cached_tokens > 300
    after = {wid: w["requests_served"] for wid, w in cluster.workers().items()}
    served = {wid: after[wid] - before.get(wid, 0) for wid in after}
    assert sorted(served.values()) == [0, 2], served  # both on one worker


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"{not json", 400),
        (json.dumps({"model": MODEL}).encode(), 400),  # no messages
        (json.dumps({"model": "no-such-model", "messages": QUESTION}).encode(), 404),
        (json.dumps({"model": MODEL, "messages": QUESTION, "max_tokens": 0}).encode(), 400),
        (
            json.dumps(
                {"model": MODEL, "messages": [{"role": "user", "content": "word " * 9000}]}
            ).encode(),
            400,
        ),
    ],
    ids=["malformed-json", "missing-field", "unknown-model", "max-tokens-0", "over-context"],
)
def test_bad_requests_get_openai_errors(cluster, body, status):
    code, payload = post(f"{cluster.url}/v1/chat/completions", body)
    assert code == status
    assert set(payload["error"]) >= {"message", "type"} and payload["error"]["message"]


def test_worker_killed_mid_stream_is_invisible_to_the_client(cluster):
    question = [
        {"role": "user", "content": "Write a long story about a brave knight and a dragon."}
    ]
    stream = cluster.client.chat.completions.create(
        model=MODEL, messages=question, temperature=0, max_tokens=40, stream=True
    )
    parts, killed = [], None
    for chunk in stream:
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
        if killed is None and len(parts) >= 5:
            busy = [w for w in cluster.workers().values() if w["inflight"] > 0]
            assert len(busy) == 1, busy
            killed = busy[0]
            os.kill(killed["pid"], signal.SIGKILL)
    assert killed is not None
    # the next requests succeed, and the killed worker comes back and serves again
    r = cluster.client.chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=8
    )
    assert r.choices[0].message.content
    # the reference computed here, while the killed worker restarts
    assert "".join(parts) == greedy_reference(question, 40)
    cluster.wait_healthy(2, timeout=180)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        w = cluster.workers()[killed["id"]]
        if w["pid"] != killed["pid"] and w["requests_served"] > 0:
            break
        for i in range(2):
            cluster.client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": f"Say {i}."}],
                temperature=0,
                max_tokens=2,
            )
    else:
        raise AssertionError("the restarted worker never served a request")


def _router_pids(port: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if b"router" in args and str(port).encode() in args and b"--zmq-bind" in args:
            pids.append(int(entry))
    return pids


def test_router_killed_comes_back_and_workers_rejoin(cluster):
    port = int(cluster.url.rsplit(":", 1)[1])
    (pid,) = _router_pids(port)
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    cluster.wait_healthy(2, timeout=120)  # a new router, both workers registered again
    back = time.monotonic() - killed
    print(f"\nrouter back with both workers registered {back:.1f}s after SIGKILL")
    r = cluster.client.chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=8
    )
    assert r.choices[0].message.content
    assert _router_pids(port) != [pid]
    assert back < 60, f"the cluster took {back:.0f}s to come back"
