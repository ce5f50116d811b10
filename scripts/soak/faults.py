"""Faults the soak injects, and how long the cluster takes to recover from each: until every
worker is healthy again (none of them a process we killed or stopped) and a probe request
succeeds."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

import aiohttp

from scripts.soak.procs import cluster_processes

KINDS = ("worker-kill", "router-kill", "worker-stop")
RECOVERY_LIMIT_S = 180.0


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
    def __init__(self, url: str, model: str, launcher_pid: int, workers: int, stop_s: float):
        self.url, self.model, self.launcher_pid = url, model, launcher_pid
        self.workers, self.stop_s = workers, stop_s
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
            pids = [w["pid"] for w in state["workers"] if w.get("healthy")]
            record = {"fault": kind, "at_s": round(at_s, 1)}
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
