"""Faults the soak injects, and how long the cluster takes to recover from each: until every
worker is healthy again (none of them a process we killed or stopped) and a probe request
succeeds.

kv-fill sends a burst of long prompts that share nothing, together about 1.5 times the
cluster's KV pool, each asking for one token: the workers must preempt, queue or refuse (a
clear error), never lose or hang one; recovery counts from the burst's last answer."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time

import aiohttp

from scripts.loadgen.workloads import paragraph
from scripts.soak.procs import cluster_processes

KINDS = ("worker-kill", "router-kill", "worker-stop", "kv-fill")
RECOVERY_LIMIT_S = 180.0
FILL_PROMPT_WORDS = 1500  # ~2k tokens: under the default model's context, costly to prefill
FILL_MAX_REQUESTS = 16
FILL_DEADLINE_S = 600.0  # a filler may wait long behind the others: slow is not a defect


async def get_json(session: aiohttp.ClientSession, url: str) -> dict | None:
    with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, ValueError, OSError):
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=3)) as resp:
            if resp.status == 200:
                return await resp.json(content_type=None)
    return None


async def probe(session: aiohttp.ClientSession, url: str, model: str) -> bool:
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, ValueError, OSError):
        timeout = aiohttp.ClientTimeout(total=10)
        async with session.post(f"{url}/v1/chat/completions", json=body, timeout=timeout) as r:
            return r.status == 200 and bool((await r.json(content_type=None)).get("choices"))
    return False


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Faults:
    def __init__(
        self,
        url: str,
        model: str,
        launcher_pid: int,
        workers: int,
        stop_s: float,
        target: str | None = None,
    ):
        self.url, self.model, self.launcher_pid = url, model, launcher_pid
        self.workers, self.stop_s = workers, stop_s
        self.target = target  # the worker id worker faults strike (None: any healthy one)
        self.router_down = False  # a router kill is under way (until recovered)
        self.stopped: set[int] = set()  # SIGSTOPped pids: SIGCONT on every path
        self.results: list[dict] = []

    def resume_all(self) -> None:
        for pid in list(self.stopped):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            self.stopped.discard(pid)

    async def inject(self, kind: str, at_s: float) -> None:
        async with aiohttp.ClientSession() as session:
            state = await get_json(session, f"{self.url}/v1/cluster") or {"workers": []}
            healthy = [w for w in state["workers"] if w.get("healthy")]
            pids = [w["pid"] for w in healthy if self.target in (None, w.get("id"))]
            record = {"fault": kind, "at_s": round(at_s, 1)}
            if kind == "kv-fill":
                self.results.append(record | await self.fill(session, state))
                return
            if kind == "router-kill":
                procs = cluster_processes(self.launcher_pid)
                victims = [pid for pid, r in procs.items() if r == "router"]
            else:
                victims = pids[:1]
            if not victims:
                self.results.append(record | {"skipped": "no target process found"})
                return
            pid = record["pid"] = victims[0]
            start = time.monotonic()
            if kind == "worker-stop":
                os.kill(pid, signal.SIGSTOP)
                self.stopped.add(pid)
                await asyncio.sleep(self.stop_s)
                os.kill(pid, signal.SIGCONT)
                self.stopped.discard(pid)
                record["stopped_s"] = self.stop_s
                start = time.monotonic()  # recovery counts from SIGCONT
                gone = set()
            else:
                self.router_down = kind == "router-kill"
                os.kill(pid, signal.SIGKILL)
                gone = {pid}
            record |= await self.recover(session, gone, start)
            self.router_down = False
            self.results.append(record)

    async def fill(self, session, state: dict) -> dict:
        """The kv-fill burst: its answers by outcome, then the recovery."""
        healthy = [w for w in state["workers"] if w.get("healthy")]
        pool_tokens = sum(w.get("kv_total_blocks", 0) * w["block_size"] for w in healthy)
        count = max(2, min(FILL_MAX_REQUESTS, round(1.5 * pool_tokens / 2000)))
        rng = random.Random(len(self.results))
        bodies = [
            {
                "model": self.model,
                "max_tokens": 1,
                "messages": [{"role": "user", "content": paragraph(rng, FILL_PROMPT_WORDS)}],
            }
            for _ in range(count)
        ]
        start = time.monotonic()
        outcomes = await asyncio.gather(*(self.filler(session, b) for b in bodies))
        record = {"requests": count, "pool_tokens": pool_tokens}
        record["burst_s"] = round(time.monotonic() - start, 1)
        record["outcomes"] = {o: outcomes.count(o) for o in sorted(set(outcomes))}
        return record | await self.recover(session, set(), time.monotonic())

    async def filler(self, session, body: dict) -> str:
        url = f"{self.url}/v1/chat/completions"
        try:
            timeout = aiohttp.ClientTimeout(total=FILL_DEADLINE_S)
            async with session.post(url, json=body, timeout=timeout) as resp:
                answer = await resp.json(content_type=None)
        except asyncio.TimeoutError:
            return "hung"
        except (aiohttp.ClientError, OSError, ValueError):
            return "lost"
        if resp.status == 200:
            return "completed" if answer.get("choices") else "lost"
        return "failed" if isinstance(answer.get("error"), dict) else "lost"

    async def recover(self, session, gone: set[int], start: float) -> dict:
        while (elapsed := time.monotonic() - start) < RECOVERY_LIMIT_S:
            state = await get_json(session, f"{self.url}/v1/cluster")
            if state is not None:
                healthy = [w for w in state["workers"] if w.get("healthy")]
                fine = [w for w in healthy if w["pid"] not in gone and alive(w["pid"])]
                if len(fine) >= self.workers and await probe(session, self.url, self.model):
                    return {"recovered": True, "recovery_s": round(time.monotonic() - start, 2)}
            await asyncio.sleep(0.25)
        return {"recovered": False, "recovery_s": round(elapsed, 2)}


def schedule(kinds: list[str], duration_s: float, every_s: float) -> list[tuple[float, str]]:
    """(seconds from the start, fault) at every `every_s`, in turn, before the end."""
    if not kinds:
        return []
    times, t = [], every_s
    while t < duration_s:
        times.append((t, kinds[len(times) % len(kinds)]))
        t += every_s
    return times
