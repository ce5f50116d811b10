"""A stored Responses conversation outlives its router, with real processes: a reply stored,
the router SIGKILLed and brought back by launch-cluster's supervisor, and the conversation
continued by previous_response_id and read back by GET; the restarted router's store keeps
its bounds (the SQLite file of docs/deploy.md "Stored responses and shared state")."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
import urllib.request
from pathlib import Path

import openai
import pytest

from tests.e2e.clients.test_agent_api_e2e import wait_healthy
from tests.support.launched import launch_cluster

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
KEPT = 3  # responses_store_size: small, so the bound is reached


def router_pid(launcher_pid: int) -> int:
    """The launcher's child running `-m router`."""
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            args = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == launcher_pid and args[1:3] == [
            b"-m",
            b"router",
        ]:
            return int(entry)
    raise AssertionError("no router process under the launcher")


def serving_again(url: str, old_pid: int, launcher_pid: int, timeout: float = 60) -> float:
    """Seconds until a new router process serves with a registered worker."""
    killed = time.monotonic()
    while time.monotonic() - killed < timeout:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if json.loads(r.read())["healthy_workers"] >= 1:
                    assert router_pid(launcher_pid) != old_pid
                    return time.monotonic() - killed
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"the router did not serve again within {timeout} s")


def test_a_conversation_continues_after_the_router_is_killed(model_cache, tmp_path):
    store = tmp_path / "responses.sqlite3"
    config = tmp_path / "fleet.toml"
    config.write_text(
        f'[router]\nresponses_store_size = {KEPT}\nresponses_store_path = "{store}"\n'
    )
    args = ["--workers", "1", "--kv-memory", "128MiB", "--config", str(config)]
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))  # nothing in the user's
    with launch_cluster(args, tmp_path / "logs", env=env) as (url, launcher):
        wait_healthy(url)
        api = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
        ask = {"model": MODEL, "max_output_tokens": 16, "temperature": 0}
        first = api.responses.create(input="My name is Ann. Say hello.", **ask)
        assert first.output_text

        pid = router_pid(launcher.pid)
        os.kill(pid, signal.SIGKILL)
        back = serving_again(url, pid, launcher.pid)
        print(f"\nrouter serving again {back:.1f}s after SIGKILL")

        assert api.responses.retrieve(first.id).output_text == first.output_text
        second = api.responses.create(
            input="What is my name?", previous_response_id=first.id, **ask
        )
        alone = api.responses.create(input="What is my name?", store=False, **ask)
        # the first turn (its input and reply) is prepended: the prompt is longer by it
        assert second.usage.input_tokens > alone.usage.input_tokens + 5
        items = api.responses.input_items.list(second.id)
        assert [i.content[0].text for i in items.data] == ["What is my name?"]

        later = [api.responses.create(input=f"Count to {n}.", **ask).id for n in range(KEPT)]
        for gone in (first.id, second.id):  # the oldest went first: the bound holds
            with pytest.raises(openai.NotFoundError):
                api.responses.retrieve(gone)
        assert all(api.responses.retrieve(rid).id == rid for rid in later)
        with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as db:
            rows = db.execute("SELECT id FROM responses ORDER BY rowid").fetchall()
        assert [r[0] for r in rows] == later
        assert not list(tmp_path.glob("cache/mlx-fleet/responses-*"))  # the configured file only
