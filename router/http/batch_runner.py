"""Runs the Batch API's batches: each line through the router's own generation path
(router/http/generate.answer: the body a live request gets), at low priority.

One router runs a batch at a time: the one holding its lease in the store (renewed every
LEASE_S / 3; with the fleet's Redis another router takes a batch over once its holder is gone
that long). A router's holder name is its host and port, so a router restarted in place takes
its batches back at once. Progress is one record per answered line, written before the line
counts: a restart re-runs only the lines in flight when it died, and every line is answered
once in the output. Lines run in prompt order (shared prefixes adjacent, so they hit the cache
the first one filled), at most `batch_lines_per_worker` per healthy worker in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
import uuid
from collections import deque

from aiohttp import web

from router.api.batch.inputs import Line, answered, jsonl, parse_input, prefix_order, unanswered
from router.api.batch.objects import (
    ACTIVE,
    BATCH,
    CANCEL,
    FILE,
    OUTPUT_PURPOSE,
    file_record,
    lines_of,
)
from router.api.openai.adapter import CHAT, COMPLETIONS
from router.api.responses.adapter import ResponsesApi
from router.api.responses.store import ScopedStore
from router.errors import ApiError
from router.http import app_keys
from router.http.embed import embed
from router.http.generate import Lane, answer
from shared.protocol import BATCH as LOW_PRIORITY

log = logging.getLogger(__name__)
LEASE_S = 30.0
SCAN_S = 2.0  # how often the store is looked at for batches to run (a create wakes it too)
RETRY_S = 0.5  # a line answered 429/503 (no worker now, overloaded) is tried again after this
RETRIED = (429, 502, 503, 504)  # not an answer: the fleet could not take the line now
MAX_ATTEMPTS_5XX = 3  # a line failing with 500 is tried this often before its error is kept
NOT_FOUND = {"message": "Not Found", "type": "invalid_request_error", "param": None}


class BatchRunner:
    def __init__(self, app: web.Application):
        self.app = app
        self.records = app[app_keys.RECORDS]
        self.holder = f"{socket.gethostname()}:{app[app_keys.CONFIG].port}"
        self.running: dict[str, asyncio.Task] = {}
        self._wake = asyncio.Event()
        self.stopping = False

    def wake(self) -> None:
        self._wake.set()

    async def watch(self) -> None:
        """The background task: take up every active batch this router can hold."""
        while not self.stopping:
            try:
                await self._scan()
            except ApiError as e:  # the shared store is down: try again later
                log.warning("batches: %s", e.message)
            except Exception:
                log.exception("batches: looking for work failed; trying again")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), SCAN_S)
            self._wake.clear()

    async def stop(self) -> None:
        """Stop every batch here (lines in flight are not recorded: a restart re-runs them)."""
        self.stopping = True
        for task in self.running.values():
            task.cancel()
        for task in list(self.running.values()):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _scan(self) -> None:
        """Claim the active batches no one holds (a router without a healthy worker leaves
        them to the routers that have one)."""
        registry = self.app[app_keys.CLUSTER].registry
        if not any(registry.healthy(model.id) for model in self.app[app_keys.MODELS]):
            return
        for batch in await self.records.values(BATCH):
            batch_id = batch["id"]
            if batch["status"] not in ACTIVE or batch_id in self.running:
                continue
            if await self.records.claim(batch_id, self.holder, LEASE_S):
                task = asyncio.get_running_loop().create_task(self._hold(batch_id))
                self.running[batch_id] = task
                task.add_done_callback(lambda _, b=batch_id: self.running.pop(b, None))

    async def _hold(self, batch_id: str) -> None:
        """Run the batch while its lease is renewed; stop when another router holds it."""
        run = asyncio.get_running_loop().create_task(Run(self, batch_id).run())
        try:
            while not run.done():
                await asyncio.wait([run], timeout=LEASE_S / 3)
                if not run.done() and not await self.records.claim(batch_id, self.holder, LEASE_S):
                    log.warning("batch %s: its lease went to another router", batch_id)
                    break
        finally:
            if not run.done():
                run.cancel()
                await asyncio.gather(run, return_exceptions=True)
        if not run.cancelled() and (error := run.exception()) is not None:
            # taken up again at the next scan (not at once: the error may be lasting)
            log.error("batch %s stopped on an error", batch_id, exc_info=error)
        else:
            self.wake()  # a batch done: look for the next


class Run:
    """One batch taken through its statuses, from where its record says it is."""

    def __init__(self, runner: BatchRunner, batch_id: str):
        self.runner, self.records, self.batch_id = runner, runner.records, batch_id
        self.batch: dict = {}
        self.lines: list[Line] = []
        self.done: dict[int, dict] = {}  # answered lines by index (their output entries)
        self.unplaced = 0  # lines sent to answer() and not yet on a worker

    async def run(self) -> None:
        self.batch = await self.records.get(BATCH, self.batch_id) or {}
        if self.batch.get("status") == "validating" and not await self._validate():
            return
        if self.batch["status"] not in ACTIVE:
            return
        self.lines, _ = parse_input(await self._input(), self.batch["endpoint"])
        for record in await self.records.values(lines_of(self.batch_id)):
            self.done[record["index"]] = record["entry"]
        if self.batch["status"] == "in_progress":
            await self._answer_all()
        await self._finalize()

    async def _input(self) -> bytes:
        return await self.records.get_blob(self.batch["input_file_id"]) or b""

    async def _validate(self) -> bool:
        """validating -> in_progress, or failed with the file's error lines (or straight
        to its end: cancelled, expired)."""
        if (ending := await self._ending()) is not None:
            await self._save(**ending)
            return True
        lines, errors = parse_input(await self._input(), self.batch["endpoint"])
        if errors:
            failed = {"object": "list", "data": errors}
            await self._save(status="failed", errors=failed, failed_at=_now())
            return False
        counts = {"total": len(lines), "completed": 0, "failed": 0}
        await self._save(status="in_progress", in_progress_at=_now(), request_counts=counts)
        return True

    async def _answer_all(self) -> None:
        """Every unanswered line, a bounded number in flight; stops for a cancel or expiry."""
        pending = deque(line for line in prefix_order(self.lines) if line.index not in self.done)
        flying: set[asyncio.Task] = set()
        loop = asyncio.get_running_loop()
        try:
            while pending or flying:
                if ending := await self._ending():
                    await self._save(**ending)
                    return
                while pending and self._room() > 0:
                    self.unplaced += 1
                    flying.add(loop.create_task(self._line(pending.popleft())))
                if not flying:  # no room anywhere (no healthy worker, other batches)
                    await asyncio.sleep(RETRY_S)
                    continue
                finished, flying = await asyncio.wait(
                    flying, timeout=1.0, return_when="FIRST_COMPLETED"
                )
                for task in finished:
                    task.result()
            await self._save(status="finalizing", finalizing_at=_now(), ending="completed")
        finally:
            for task in flying:
                task.cancel()  # (its jobs are aborted on the workers)
            await asyncio.gather(*flying, return_exceptions=True)

    def _room(self) -> int:
        """New lines to send now: what the workers have room for (Dispatcher.batch_room,
        idle workers more than busy ones) less the lines sent and not yet placed."""
        per_worker = self.runner.app[app_keys.CONFIG].batch_lines_per_worker
        room = sum(m.dispatcher.batch_room(per_worker) for m in self.runner.app[app_keys.MODELS])
        return room - self.unplaced

    async def _ending(self) -> dict | None:
        """The save that stops the batch (a cancel asked for, the window passed), or None."""
        if await self._cancel_asked():
            asked = await self.records.get(CANCEL, self.batch_id)
            return {"status": "cancelling", "cancelling_at": asked["at"], "ending": "cancelled"}
        if _now() >= self.batch["expires_at"]:
            return {"status": "finalizing", "finalizing_at": _now(), "ending": "expired"}
        return None

    async def _cancel_asked(self) -> bool:
        return await self.records.get(CANCEL, self.batch_id) is not None

    async def _line(self, line: Line) -> None:
        status, body = await self._reply(line)
        if self.runner.stopping:
            raise asyncio.CancelledError  # a shutdown's error is not the line's answer
        entry = answered(line.custom_id, status, body)
        await self.records.put(
            lines_of(self.batch_id), str(line.index), {"index": line.index, "entry": entry}
        )
        self.done[line.index] = entry
        await self._save(request_counts=self._counts())

    async def _reply(self, line: Line) -> tuple[int, dict]:
        body = line.body
        if self.batch["endpoint"] != "/v1/embeddings":  # (an embeddings body has no `stream`)
            body = {**body, "stream": False}
            body.pop("stream_options", None)
        attempt = 0
        while True:  # (the line counts as unplaced from its launch until a worker has it)
            placed = self._placer()
            try:
                status, reply = await self._answer(body, placed)
            finally:
                placed()
            attempt += 1
            if status in RETRIED or (status >= 500 and attempt < MAX_ATTEMPTS_5XX):
                self.unplaced += 1  # waiting to be placed again
                await asyncio.sleep(RETRY_S)
                continue
            return status, reply

    def _placer(self):
        """A function that counts one line as placed, the first time it is called."""
        unplaced = [True]

        def placed() -> None:
            if unplaced:
                unplaced.pop()
                self.unplaced -= 1

        return placed

    async def _answer(self, body: dict, placed) -> tuple[int, dict]:
        """The line's body through its endpoint's API (an endpoint not served: its 404);
        `placed()` once its job is on a worker."""
        app, endpoint, owner = self.runner.app, self.batch["endpoint"], self.batch["owner"]
        lane = Lane(LOW_PRIORITY, self._per_worker, placed)
        if endpoint == "/v1/chat/completions":
            return await answer(app, CHAT, body, lane)
        if endpoint == "/v1/completions":
            return await answer(app, COMPLETIONS, body, lane)
        if endpoint == "/v1/responses":
            view = ScopedStore(owner)
            previous = body.get("previous_response_id")
            if isinstance(previous, str):
                stored = await app[app_keys.RESPONSES].get(previous, owner)
                if stored is not None:
                    view.loaded[previous] = stored
            status, reply = await answer(app, ResponsesApi(view), body, lane)
            for entry in view.pending:
                await app[app_keys.RESPONSES].put(entry)
            return status, reply
        if endpoint == "/v1/embeddings":
            placed()  # (an embedding job is placed as it starts)
            try:
                reply, _, _ = await embed(app, body, f"embd-{uuid.uuid4().hex}")
            except ApiError as e:
                return e.status, e.body()
            return 200, reply
        return 404, {"error": {**NOT_FOUND, "code": "not_found"}}

    @property
    def _per_worker(self) -> int:
        return self.runner.app[app_keys.CONFIG].batch_lines_per_worker

    def _counts(self) -> dict:
        ok = sum(1 for e in self.done.values() if e["response"]["status_code"] == 200)
        return {"total": len(self.lines), "completed": ok, "failed": len(self.done) - ok}

    async def _finalize(self) -> None:
        """Write the output and error files, then the final status (a crash before it ends is
        finalized again from the same records: the files' ids are the batch's own)."""
        ending = self.batch.get("ending", "completed")
        entries = [self.done[i] for i in sorted(self.done)]
        good = [e for e in entries if e["response"]["status_code"] == 200]
        bad = [e for e in entries if e["response"]["status_code"] != 200]
        code = "batch_cancelled" if ending == "cancelled" else "batch_expired"
        bad += [
            unanswered(line.custom_id, code) for line in self.lines if line.index not in self.done
        ]
        ids = {}
        for name, kept in (("output", good), ("error", bad)):
            if kept:
                ids[f"{name}_file_id"] = await self._write_file(name, kept)
        counts = self._counts()
        counts["failed"] = counts["total"] - counts["completed"]
        await self._save(status=ending, **{f"{ending}_at": _now()}, request_counts=counts, **ids)
        await self.records.drop(lines_of(self.batch_id))
        await self.records.delete(CANCEL, self.batch_id)

    async def _write_file(self, name: str, entries: list[dict]) -> str:
        file_id = f"file-{self.batch_id.removeprefix('batch_')}-{name}"
        data = jsonl(entries)
        filename = f"{self.batch_id}_{name}.jsonl"
        record = file_record(
            file_id, filename, OUTPUT_PURPOSE, len(data), _now(), self.batch["owner"]
        )
        await self.records.put_blob(file_id, data)
        await self.records.put(FILE, file_id, record)
        return file_id

    async def _save(self, **changes) -> None:
        self.batch.update(changes)
        await self.records.put(BATCH, self.batch_id, self.batch)


def _now() -> int:
    return int(time.time())
