"""One placement for two routers (issue 50), real processes: two routers sharing a real
redis-server (tests/support/redis_server.py), two host agents serving both, a catalog of two
tiny random models. Requests for a model through both routers at once start one worker of it
(its max_workers), never two; the leading router SIGKILLed while that worker loads, the other
answers its waiting requests once the worker registers, takes placement over, and loads the
next model asked of it. The operator's pin asked of the follower is done by the leader."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from fleet.launch import free_port
from tests.e2e.routers.fleet_processes import stream_chat
from tests.support.launched import get_json, spawn, stop_all, wait_for
from tests.support.tp_group import save_tiny_model

pytestmark = pytest.mark.slow
KV = 64 << 20


def cluster_or_none(url: str) -> dict | None:
    try:
        return get_json(f"{url}/v1/cluster", timeout=2)
    except (OSError, ValueError):
        return None


def workers_of(view: dict | None, model: str) -> list[str]:
    """The worker processes of `model` the hosts report, in a router's /v1/cluster."""
    hosts = (view or {}).get("hosts", [])
    return [w["worker_id"] for h in hosts for w in h["workers"] if w["model"] == model]


class WorkerCount:
    """Polls both routers while the test runs: the most workers of a model any host report
    showed at once."""

    def __init__(self, urls: list[str], model: str):
        self.urls, self.model, self.most, self.looks = urls, model, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            for url in self.urls:
                if (view := cluster_or_none(url)) is not None:
                    self.most = max(self.most, len(workers_of(view, self.model)))
                    self.looks += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def ask(url: str, model: str) -> str:
    api = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
    reply = api.chat.completions.create(
        model=model,
        max_tokens=3,
        temperature=0,
        messages=[{"role": "user", "content": "hello"}],
    )
    assert reply.choices[0].finish_reason in ("stop", "length")
    return reply.choices[0].message.content or ""


def test_two_routers_place_as_one_and_survive_the_leader(tmp_path, redis_url):
    models = {m: save_tiny_model(tmp_path / m, seed=i) for i, m in enumerate(("one", "two"))}
    zmqs = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
    ports = [free_port() for _ in range(2)]
    config = tmp_path / "fleet.toml"
    catalog = "".join(
        f'[[models]]\nid = "{m}"\npath = "{p}"\nkv_memory = "{KV}"\nmax_workers = 1\n'
        for m, p in models.items()
    )
    router = f'[router]\nstate_url = "{redis_url}"\nplacement_lease_s = 2.0\n'
    router += "heartbeat_timeout_s = 3.0\n"
    config.write_text(catalog + router + f"[worker]\nrouter = {json.dumps(zmqs)}\n")
    py = [sys.executable, "-m"]
    procs: dict[str, subprocess.Popen] = {}
    for i, (port, zmq) in enumerate(zip(ports, zmqs, strict=True)):
        cmd = py + ["router", "--config", str(config), "--port", str(port), "--zmq-bind", zmq]
        procs[f"router-{i}"] = spawn(cmd, tmp_path / f"router-{i}.log")
    for host in ("host-a", "host-b"):
        cmd = py + ["fleet.host", "--config", str(config), "--host-id", host]
        cmd += ["--memory-budget", "8GiB", "--log-dir", str(tmp_path / host)]
        procs[host] = spawn(cmd, tmp_path / f"{host}.log")
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    watch = None
    try:
        for url in urls:
            wait_for(lambda u=url: len((cluster_or_none(u) or {}).get("hosts", [])) == 2, 60)
        leader_id = wait_for(
            lambda: _agreed_leader([cluster_or_none(u) for u in urls]), 20, "a placement leader"
        )
        leading = next(i for i, u in enumerate(urls) if cluster_or_none(u)["placement"]["leading"])
        leader, survivor = urls[leading], urls[1 - leading]
        assert leader_id.endswith(f"/{procs[f'router-{leading}'].pid}")
        # the operator's pin, asked of the follower, is done by the leader
        pin = urllib.request.Request(f"{survivor}/v1/admin/models/two/pin", b"{}", method="POST")
        with urllib.request.urlopen(pin, timeout=10) as reply:
            assert reply.status == 200
        wait_for(lambda: _model(leader, "two")["pinned"], 10, "two pinned by the leader")
        watch = WorkerCount(urls, "one")
        with ThreadPoolExecutor(8) as pool:
            through_survivor = [pool.submit(ask, survivor, "one") for _ in range(3)]
            through_survivor.append(pool.submit(stream_chat, survivor, "hi", 3, "one"))
            through_leader = [pool.submit(ask, leader, "one") for _ in range(4)]
            wait_for(lambda: workers_of(cluster_or_none(survivor), "one"), 30, "one loading")
            procs[f"router-{leading}"].send_signal(signal.SIGKILL)  # while it loads
            for future in through_survivor:
                future.result(timeout=60)  # every request waiting on the survivor is answered
            for future in through_leader:
                future.exception(timeout=60)  # (lost with their router, or answered before)
        view = wait_for(
            lambda: (v := cluster_or_none(survivor)) and v["placement"]["leading"] and v,
            20,
            "the survivor leading placement",
        )
        assert view["placement"]["leader"] == view["placement"]["router"]
        assert len(workers_of(view, "one")) == 1
        ask(survivor, "two")  # placed by the new leader
        assert len(workers_of(cluster_or_none(survivor), "two")) == 1
        watch.stop()
        assert watch.looks > 10 and watch.most == 1, watch.most
    finally:
        if watch is not None:
            watch.stop()
        stop_all(procs.values())


def _agreed_leader(views: list[dict | None]) -> str | None:
    """The leader both routers name, once they agree on one."""
    leaders = {(v or {}).get("placement", {}).get("leader") for v in views}
    return leaders.pop() if len(leaders) == 1 and None not in leaders else None


def _model(url: str, model: str) -> dict:
    return next(m for m in get_json(f"{url}/v1/admin/models")["models"] if m["id"] == model)
