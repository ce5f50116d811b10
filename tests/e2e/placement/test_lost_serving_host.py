"""A host agent, then a worker, lost while it serves a model that requests keep asking for
(issue 50), real processes: a router and two host agents, budgets that hold one tiny model
per host. Every request completes or, when its stream had started, ends with the API's error
event; none gets a 5xx. `/v1/cluster`, sampled every 0.2 s through both losses, the host's
restart, evictions and a failed load, never shows a host's `used_bytes` over its budget or a
negative `free_bytes`."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
from collections import Counter

import openai
import pytest

from fleet.launch import free_port
from shared.placement.footprint import computes_in_float32, estimate
from tests.support.launched import get_json, spawn, stop_all, wait_for
from tests.support.tp_group import save_tiny_model

pytestmark = pytest.mark.slow
KV = 16 << 20


def hosts(url: str) -> dict[str, dict]:
    return {h["id"]: h for h in get_json(f"{url}/v1/cluster")["hosts"]}


def alive_hosts(url: str) -> list[str]:
    try:
        return [h for h, d in hosts(url).items() if d["alive"]]
    except OSError:
        return []


def serving(url: str, model: str) -> tuple[str, int] | None:
    """(host, worker pid) of a worker of `model` that is up, if any."""
    for host, data in hosts(url).items():
        for worker in data["workers"]:
            if worker["model"] == model and data["alive"] and worker.get("pid"):
                return host, worker["pid"]
    return None


class UsedWatch:
    """Samples /v1/cluster every 0.2 s: every host's reported `used_bytes` within its budget
    and `free_bytes` never negative."""

    def __init__(self, url: str):
        self.url, self.looks, self.bad = url, 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                for host in hosts(self.url).values():
                    if host["used_bytes"] > host["budget_bytes"] or host["free_bytes"] < 0:
                        self.bad.append(
                            (
                                host["id"],
                                host["used_bytes"],
                                host["budget_bytes"],
                                host["free_bytes"],
                            )
                        )
                self.looks += 1
            except OSError:
                pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class Traffic:
    """Clients asking for `model` back to back, every other request streamed, until stopped.
    Each outcome: "ok", "stream_error" (an error event after the stream started) or the
    failing status code."""

    def __init__(self, url: str, model: str, clients: int = 3):
        self.api = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
        self.model, self.outcomes = model, Counter()
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,)) for i in range(clients)]
        for thread in self._threads:
            thread.start()

    def _run(self, client: int) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            self.outcomes[self._one(stream=(client + n) % 2 == 0)] += 1

    def _one(self, stream: bool):
        messages = [{"role": "user", "content": "Name a French city."}]
        started = False
        try:
            if not stream:
                reply = self.api.chat.completions.create(
                    model=self.model, messages=messages, max_tokens=12, temperature=0
                )
                assert reply.choices[0].finish_reason in ("stop", "length")
                return "ok"
            for _chunk in self.api.chat.completions.create(
                model=self.model, messages=messages, max_tokens=12, temperature=0, stream=True
            ):
                started = True
            return "ok"
        except openai.APIStatusError as e:
            self.failures.append(f"{e.status_code}: {e.body}")
            return e.status_code
        except openai.APIError as e:  # an error event inside the stream
            if started:
                return "stream_error"
            self.failures.append(f"before any chunk: {e}")
            return "error_before_start"
        except openai.APIConnectionError as e:
            self.failures.append(f"connection: {e}")
            return "connection"

    def ok(self) -> int:
        return self.outcomes["ok"]

    def stop(self) -> Counter:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=180)
        return self.outcomes


def test_requests_survive_a_lost_host_and_a_lost_worker_within_budgets(tmp_path):
    tinies = {f"tiny{i}": save_tiny_model(tmp_path / f"tiny{i}", seed=10 + i) for i in range(1, 4)}
    broken = tmp_path / "broken"
    shutil.copytree(tinies["tiny1"], broken)
    (broken / "model.safetensors").write_bytes(b"\x07" * 4096)  # corrupt weights
    float32 = computes_in_float32("auto")
    size = max(estimate(path, KV, float32=float32) for path in tinies.values())
    budget = size + size // 4  # one model per host
    port, zmq = free_port(), f"tcp://127.0.0.1:{free_port()}"
    text = "".join(
        f'[[models]]\nid = "{name}"\npath = "{path}"\nkv_memory = "{KV}"\n'
        for name, path in {**tinies, "broken": broken}.items()
    )
    text += f'[router]\nport = {port}\nzmq_bind = "{zmq}"\nheartbeat_timeout_s = 3.0\n'
    text += f'[worker]\nrouter = "{zmq}"\n'
    config = tmp_path / "fleet.toml"
    config.write_text(text)
    py = [sys.executable, "-m"]
    procs = {"router": spawn(py + ["router", "--config", str(config)], tmp_path / "router.log")}

    def start_host(host: str) -> None:
        cmd = py + ["fleet.host", "--config", str(config), "--host-id", host]
        cmd += ["--memory-budget", str(budget), "--log-dir", str(tmp_path / host)]
        procs[host] = spawn(cmd, tmp_path / f"{host}.log")

    for host in ("host-a", "host-b"):
        start_host(host)
    url = f"http://127.0.0.1:{port}"
    watch = None
    try:
        wait_for(lambda: len(alive_hosts(url)) == 2, 90, "two host agents")
        watch = UsedWatch(url)

        # 1. the host agent serving tiny1 is SIGKILLed (its worker goes with it)
        traffic = Traffic(url, "tiny1")
        wait_for(lambda: traffic.ok() >= 3, 120, "tiny1 answering")
        lost, _ = serving(url, "tiny1")
        procs[lost].send_signal(signal.SIGKILL)
        before = traffic.ok()
        wait_for(lambda: traffic.ok() >= before + 6, 120, "tiny1 answering after its host died")
        outcomes = traffic.stop()
        print(f"host lost: {dict(outcomes)}")
        assert set(outcomes) <= {"ok", "stream_error"}, (outcomes, traffic.failures[:5])
        survivor = "host-b" if lost == "host-a" else "host-a"
        assert serving(url, "tiny1")[0] == survivor

        # 2. the worker serving tiny1 is SIGKILLed; its host agent lives
        traffic = Traffic(url, "tiny1")
        wait_for(lambda: traffic.ok() >= 3, 60, "tiny1 answering again")
        _, pid = serving(url, "tiny1")
        os.kill(pid, signal.SIGKILL)
        before = traffic.ok()
        wait_for(lambda: traffic.ok() >= before + 6, 120, "tiny1 answering after its worker died")
        outcomes = traffic.stop()
        print(f"worker lost: {dict(outcomes)}")
        assert set(outcomes) <= {"ok", "stream_error"}, (outcomes, traffic.failures[:5])

        # 3. the lost host comes back; evictions and a failed load, budgets sampled throughout
        start_host(lost)
        wait_for(lambda: len(alive_hosts(url)) == 2, 90, "the lost host back")
        api = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
        # two hosts, three models: tiny3 evicts tiny1 on one host, then tiny1 evicts tiny2
        for model in ("tiny2", "tiny3", "tiny1"):
            reply = api.completions.create(model=model, prompt="hi", max_tokens=2)
            assert reply.choices[0].finish_reason in ("stop", "length")
        with pytest.raises(openai.APIStatusError) as failed:
            api.completions.create(model="broken", prompt="hi", max_tokens=2)
        assert failed.value.status_code == 503
        assert "model.safetensors" in failed.value.body["message"]
    finally:
        if watch is not None:
            watch.stop()
        stop_all(procs.values())
    assert watch.looks > 20 and watch.bad == [], watch.bad[:5]
