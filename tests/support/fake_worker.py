"""A stand-in worker: a real DEALER socket speaking shared.protocol, no model.

It registers, heartbeats, and "generates" token alphabet[len(context) % len(alphabet)] per step:
a function of the context length only, so a request moved to another stand-in after k tokens
(prompt + k generated tokens) continues exactly where it left off. It emits BlockStored events
for the prompt's full blocks, reports cached tokens from its own record of them, and honours
Abort. Run as a process: `python -m tests.support.fake_worker --connect tcp://...`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

import zmq
import zmq.asyncio
from zmq.utils.monitor import recv_monitor_message

from shared.curve import configure_client
from shared.hashing import ROOT_PARENT_HASH, hash_blocks
from shared.kv_events import BlockStored
from shared.placement.messages import (
    HostFetch,
    HostHello,
    HostReport,
    StartWorker,
    WorkerExited,
)
from shared.protocol import (
    PROTOCOL_VERSION,
    Abort,
    AttentionReport,
    Generate,
    Heartbeat,
    KVEvents,
    LinkRate,
    Message,
    Register,
    RegisterAck,
    Shutdown,
    TokenDelta,
    TopLogprobs,
    Usage,
    decode,
    encode,
)


@dataclass
class FakeWorkerConfig:
    endpoint: str
    worker_id: str = "fake-0"
    block_size: int = 4
    kv_capacity_blocks: int = 4096
    token_delay_s: float = 0.0  # before each generated token
    alphabet: tuple[int, ...] = tuple(range(50, 60))
    protocol_version: int = PROTOCOL_VERSION
    error: str | None = None  # end every request with this error...
    error_after_tokens: int = 0  # ...after generating this many tokens
    silent: bool = False  # accept requests but never answer (a stuck worker)
    curve: tuple[Path, Path] | None = None  # (own secret key file, router's public key file)
    watch_handshake: bool = False  # set handshake_failed when the router refuses the connection
    model_id: str = "tiny"  # the model it says it serves (tests/conftest.py's)
    wedged: bool = False  # heartbeat, busy, but the loop counter never moves (a stuck step)
    # the fleet cache: what it registers and reports (it moves no blocks itself)
    kv_endpoint: str = ""
    role: str = "both"
    kv_layout: str = "float32"
    kv_bytes_per_token: int = 0  # 0: registers no AttentionReport
    links: tuple[LinkRate, ...] = ()
    prefill_tokens_per_s: float = 0.0
    pulled_blocks: int = 0
    prefill_error: str | None = None  # answer prefill_only requests with this error
    partial_blocks: int = 0  # partial tails its cache reports keeping beside the full blocks
    vision: bool = False  # registers as taking images...
    vision_note: str = ""  # ...or why it does not


@dataclass
class FakeWorker:
    config: FakeWorkerConfig
    received: list[Generate] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    ack: RegisterAck | None = None
    registered: asyncio.Event = field(default_factory=asyncio.Event)
    handshake_failed: asyncio.Event = field(default_factory=asyncio.Event)
    _cached: set[int] = field(default_factory=set)
    _running: dict[str, asyncio.Task] = field(default_factory=dict)
    _sock: zmq.asyncio.Socket | None = None
    _hit_tokens: int = 0
    _prompt_tokens: int = 0
    _loop_turns: int = 0

    async def run(self) -> None:
        """Connect, register, then serve until cancelled or told to shut down."""
        ctx = zmq.asyncio.Context()
        self._sock = ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        if self.config.curve is not None:
            configure_client(self._sock, *self.config.curve)
        self._sock.connect(self.config.endpoint)
        heartbeats = None
        monitor, monitor_sock = None, None
        if self.config.watch_handshake:
            monitor_sock = self._sock.get_monitor_socket()
            monitor = asyncio.create_task(self._watch_handshake(monitor_sock))
        try:
            await self._send(self._register_msg())
            while True:
                msg = decode(await self._sock.recv())
                if isinstance(msg, RegisterAck):
                    self.ack = msg
                    self.registered.set()
                    if not msg.accepted:
                        return
                    heartbeats = asyncio.create_task(self._heartbeats(msg.heartbeat_interval_s))
                elif isinstance(msg, Shutdown):
                    return
                else:
                    self._handle(msg)
        finally:
            for task in [heartbeats, monitor, *self._running.values()]:
                if task is not None:
                    task.cancel()
            if monitor_sock is not None:  # ctx.term() waits for every socket to close
                self._sock.disable_monitor()
                monitor_sock.close(linger=0)
            self._sock.close(linger=0)
            ctx.term()

    async def _watch_handshake(self, monitor: zmq.asyncio.Socket) -> None:
        failures = {zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL}
        failures.add(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
        while True:
            event = await recv_monitor_message(monitor)
            if event["event"] in failures:
                self.handshake_failed.set()

    def _handle(self, msg: Message) -> None:
        if isinstance(msg, Generate):
            self.received.append(msg)
            if not (self.config.silent or self.config.wedged):
                task = asyncio.create_task(self._generate(msg))
                self._running[msg.request_id] = task
        elif isinstance(msg, Abort):
            self.aborted.append(msg.request_id)
            if msg.index is not None:
                return  # one choice: the fake keeps generating it (the router ignores it)
            task = self._running.pop(msg.request_id, None)
            if task is not None:
                task.cancel()

    async def _generate(self, msg: Generate) -> None:
        try:
            cached_tokens = await self._prefill(msg.token_ids)
            if msg.prefill_only:
                error = self.config.prefill_error
                finish = "error" if error else "prefilled"
                await self._send(TokenDelta(msg.request_id, (), finish, error=error))
                return
            await asyncio.gather(*(self._decode(msg, cached_tokens, i) for i in range(msg.n)))
        finally:
            self._running.pop(msg.request_id, None)

    async def _prefill(self, token_ids: tuple[int, ...]) -> int:
        """Cache the prompt's full blocks; returns the prompt tokens already cached."""
        size = self.config.block_size
        hashes = hash_blocks(token_ids, size)
        hit = next((i for i, h in enumerate(hashes) if h not in self._cached), len(hashes))
        events = [
            BlockStored(
                h,
                hashes[i - 1] if i else ROOT_PARENT_HASH,
                tuple(token_ids[i * size : (i + 1) * size]),
                size,
            )
            for i, h in enumerate(hashes)
            if h not in self._cached
        ]
        self._cached.update(hashes)
        self._hit_tokens += hit * size
        self._prompt_tokens += len(token_ids)
        if events:
            await self._send(KVEvents(self.config.worker_id, tuple(events)))
        return hit * size

    async def _decode(self, msg: Generate, cached_tokens: int, index: int = 0) -> None:
        """Choice `index` walks the alphabet from its own offset."""
        context = list(msg.token_ids) + [0] * index
        alphabet = self.config.alphabet
        stop_ids = set(msg.sampling.stop_token_ids)
        prompt = _fake_prompt_logprobs(msg.sampling, msg.token_ids, alphabet)
        if msg.sampling.max_tokens == 0:  # the prompt scored, nothing generated
            usage = Usage(len(msg.token_ids), 0, cached_tokens)
            await self._send(TokenDelta(msg.request_id, (), "length", usage, index=index, **prompt))
            return
        for produced in range(1, msg.sampling.max_tokens + 1):
            if self.config.token_delay_s:
                await asyncio.sleep(self.config.token_delay_s)
            if self.config.error is not None and produced > self.config.error_after_tokens:
                await self._send(TokenDelta(msg.request_id, (), "error", error=self.config.error))
                return
            token = alphabet[len(context) % len(alphabet)]
            context.append(token)
            finish = "stop" if token in stop_ids else None
            if finish is None and produced == msg.sampling.max_tokens:
                finish = "length"
            # as a real worker: usage on the first delta (cached tokens known) and the last
            first_or_last = finish or produced == 1
            usage = Usage(len(msg.token_ids), produced, cached_tokens) if first_or_last else None
            logprobs = _fake_logprobs(msg.sampling, token, alphabet) if finish != "stop" else {}
            if produced == 1:
                logprobs.update(prompt)
            await self._send(
                TokenDelta(msg.request_id, (token,), finish, usage, index=index, **logprobs)
            )
            if finish:
                return

    async def _heartbeats(self, interval_s: float) -> None:
        while True:
            total = self.config.kv_capacity_blocks
            cached = min(len(self._cached), total)
            partial = min(self.config.partial_blocks, total - cached)
            if not self.config.wedged or not self.received:  # stuck from its first request
                self._loop_turns += 1
            await self._send(
                Heartbeat(
                    self.config.worker_id,
                    running=len(self.received) if self.config.wedged else len(self._running),
                    waiting=0,
                    free_blocks=total - cached - partial,
                    total_blocks=total,
                    cached_blocks=cached,
                    cached_partial_blocks=partial,
                    hit_tokens=self._hit_tokens,
                    prompt_tokens=self._prompt_tokens,
                    loop_turns=self._loop_turns,
                    links=self.config.links,
                    pulled_blocks=self.config.pulled_blocks,
                    prefill_tokens_per_s=self.config.prefill_tokens_per_s,
                )
            )
            await asyncio.sleep(interval_s)

    def _register_msg(self) -> Register:
        c = self.config
        attention = None
        if c.kv_bytes_per_token:
            attention = AttentionReport(
                "mlx", "auto", kv_layout=c.kv_layout, kv_bytes_per_token=c.kv_bytes_per_token
            )
        return Register(
            self.config.worker_id,
            self.config.model_id,
            self.config.block_size,
            self.config.kv_capacity_blocks,
            socket.gethostname(),
            os.getpid(),
            self.config.protocol_version,
            attention=attention,
            kv_endpoint=self.config.kv_endpoint,
            role=self.config.role,
            vision=self.config.vision,
            vision_note=self.config.vision_note,
        )

    async def _send(self, msg: Message) -> None:
        await self._sock.send(encode(msg))


def _fake_logprobs(sampling, token: int, alphabet: tuple[int, ...]) -> dict:
    """With logprobs asked for: the token at -0.5, then the next alphabet tokens at -1.5,
    -2.5, ... as the alternatives (the token itself first)."""
    if not sampling.logprobs:
        return {}
    fields: dict = {"logprobs": (-0.5,)}
    if sampling.top_logprobs:
        start = alphabet.index(token)
        ids = [alphabet[(start + i) % len(alphabet)] for i in range(sampling.top_logprobs)]
        values = [-0.5 - i for i in range(len(ids))]
        fields["top_logprobs"] = (TopLogprobs(tuple(ids), tuple(values)),)
    return fields


def _fake_prompt_logprobs(sampling, token_ids: tuple[int, ...], alphabet: tuple[int, ...]) -> dict:
    """With prompt_logprobs asked for: prompt token i (from 1) at -0.25 * i, rank i, and the
    first prompt_logprobs alphabet tokens at -0.1, -0.2, ... as the alternatives."""
    k = sampling.prompt_logprobs
    if k is None:
        return {}
    scored = range(1, len(token_ids))
    fields: dict = {
        "prompt_logprobs": tuple(-0.25 * i for i in scored),
        "prompt_ranks": tuple(scored),
    }
    if k:
        top = TopLogprobs(alphabet[:k], tuple(-0.1 * (j + 1) for j in range(k)))
        fields["prompt_top_logprobs"] = (top,) * len(scored)
    return fields


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connect", required=True, help="the router's ZeroMQ address")
    parser.add_argument("--worker-id", default=f"fake-{os.getpid()}")
    parser.add_argument("--block-size", type=int, default=4)
    parser.add_argument("--token-delay", type=float, default=0.0, help="seconds per token")
    parser.add_argument("--curve-secret-key", type=Path, help="own CURVE secret key file")
    parser.add_argument("--curve-server-key", type=Path, help="the router's CURVE public key")
    args = parser.parse_args(argv)
    curve = None
    if args.curve_secret_key is not None:
        curve = (args.curve_secret_key, args.curve_server_key)
    config = FakeWorkerConfig(
        args.connect,
        args.worker_id,
        block_size=args.block_size,
        token_delay_s=args.token_delay,
        curve=curve,
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(FakeWorker(config).run())


if __name__ == "__main__":
    main()


class FakeHost:
    """A host agent on a real DEALER socket: it says hello, reports an empty budget every 0.1 s
    (its heartbeat, with the Hub fetches a test sets in `fetches`) and keeps what the router
    sends it, starting nothing."""

    def __init__(self, endpoint: str, host_id: str, budget_bytes: int, models: tuple[str, ...]):
        self.hello = HostHello(host_id, "machine-" + host_id, 4242, budget_bytes, models)
        self.received: list[object] = []
        self.fetches: tuple[HostFetch, ...] = ()
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.linger = 0
        self._sock.connect(endpoint)

    async def run(self) -> None:
        await self._sock.send(encode(self.hello))
        while True:
            if await self._sock.poll(100):
                self.received.append(decode(await self._sock.recv()))
            report = HostReport(self.hello.host_id, self.hello.budget_bytes, (), (), self.fetches)
            await self._sock.send(encode(report))

    def starts(self) -> list[StartWorker]:
        return [m for m in self.received if isinstance(m, StartWorker)]

    async def exited(self, worker_id: str, model: str, reason: str, asked: bool = False) -> None:
        """Tell the router a worker of this host ended (a failed load, when not asked)."""
        await self._sock.send(
            encode(WorkerExited(self.hello.host_id, worker_id, model, asked, reason))
        )

    def close(self) -> None:
        self._sock.close()
        self._ctx.term()
