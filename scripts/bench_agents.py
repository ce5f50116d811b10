#!/usr/bin/env python
"""Claude Code's real prompts, replayed as OpenAI chat requests: time to first token per turn on
the fleet, mlx_lm.server and vllm-mlx, one server after another in the same run (issue #48).

A recorded Claude Code request (its own ~21k-token system prompt and 24 tools; by default the
fixture scripts/data/agents/claude-code-2.1.197.json, recorded by scripts/check-coding-agents
--record) is converted to a chat request: the system blocks become one system message of text
parts, the billing block (`x-anthropic-billing-header: cc_version=2.1.197.XYZ; ...`) first, its
XYZ varied per session as Claude Code varies it per conversation; tools become functions. Each
server then serves, streamed, greedy, a few tokens each:

  1. a first wave of --sessions sessions (default 4) started together, each running --turns
     turns (default 3) one after another (a turn adds a fixed assistant reply and a new user
     message to the session's history);
  2. then --new-sessions new sessions (default 2) started together, one turn each.

Time to first token is the time to the first streamed chunk carrying a token (or the finish).
One JSON line per server: the first wave's first turns (median), later turns (p50), the new
sessions' first turns (median), each a median over --repeats rounds (servers interleaved within
a round), with the prompt and cached tokens the server reported (where it does). Then one line
of ratios: the best peer's time over ours (above 1: ours is faster). No time window: every
server runs every request to the end.

The servers all serve one model directory: by default a tiny random-weight llama with a 32k
context and SmolLM2's tokenizer (the default model's 8,192-token context cannot hold the prompt),
built on first use; --model names another. Peers get the BLAS our workers preload.

    scripts/bench_agents.py                                   # all three servers
    scripts/bench_agents.py --servers fleet --sessions 1 --turns 2 --new-sessions 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

import aiohttp  # noqa: E402

from scripts.check_coding_agents import (  # noqa: E402
    LONG_CONTEXT_MODEL,
    billing_block,
    chat_usage,
    long_context_model,
    with_billing,
)

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "scripts" / "data" / "agents" / "claude-code-2.1.197.json"
SERVERS = ("fleet", "mlx_lm", "vllm_mlx")
CONFIG_OF = {"fleet": "ours-1", "mlx_lm": "mlx_lm", "vllm_mlx": "vllm_mlx"}
ASSISTANT_REPLY = "Done. Anything else?"
LATER_TURNS = (
    "Now reply with the single word: again",
    "Last one: reply with the single word: done",
    "And once more: reply with the single word: more",
)
METRICS = ("first_wave_first_turn_s", "later_turns_p50_s", "new_session_first_turn_s")


# ------------------------------------------------------------ Anthropic -> OpenAI chat


def _text_parts(content) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [{"type": "text", "text": b["text"]} for b in content if b.get("type") == "text"]


def _chat_messages(message: dict) -> list[dict]:
    """One Anthropic message as chat messages: tool results become tool messages, tool uses
    tool calls; thinking blocks and images are dropped."""
    content = message["content"]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
    if message["role"] == "system":  # Claude Code's mid-conversation system messages
        return [{"role": "system", "content": _text_parts(blocks)}]
    if message["role"] == "assistant":
        text = "".join(b["text"] for b in blocks if b.get("type") == "text")
        calls = [
            {
                "id": b["id"],
                "type": "function",
                "function": {"name": b["name"], "arguments": json.dumps(b.get("input") or {})},
            }
            for b in blocks
            if b.get("type") == "tool_use"
        ]
        return [{"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})}]
    out = []
    for b in blocks:
        if b.get("type") == "tool_result":
            result = b.get("content")
            text = (
                result
                if isinstance(result, str)
                else "".join(p["text"] for p in result or [] if p.get("type") == "text")
            )
            out.append({"role": "tool", "tool_call_id": b["tool_use_id"], "content": text})
    parts = _text_parts([b for b in blocks if b.get("type") == "text"])
    if parts:
        out.append({"role": "user", "content": parts})
    return out


def anthropic_to_chat(body: dict, max_tokens: int) -> dict:
    """A Messages request as a streamed, greedy Chat Completions request (same model name)."""
    system = body.get("system") or []
    messages = [{"role": "system", "content": _text_parts(system)}] if system else []
    for message in body["messages"]:
        messages += _chat_messages(message)
    tools = [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t.get("description", ""),
                "parameters": t.get("input_schema") or {"type": "object"},
            },
        }
        for t in body.get("tools") or []
        if "input_schema" in t
    ]
    chat = {
        "model": body.get("model"),
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    return chat | ({"tools": tools} if tools else {})


# ------------------------------------------------------------ sessions from one recording

FIXED_SESSION = "00000000-0000-4000-8000-000000000001"
_SCRUB = (
    (re.compile(r"/tmp/check-agents-[A-Za-z0-9_]+/claude-code"), "/home/user/project"),
    (re.compile(r"-tmp-check-agents-[A-Za-z0-9_]+-claude-code"), "-home-user-project"),
    (re.compile(r"OS Version: [^\n\\]+"), "OS Version: Linux 6.1.0"),
    (re.compile(r'\\"device_id\\":\\"[0-9a-f]+\\"'), '\\"device_id\\":\\"' + "0" * 64 + '\\"'),
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), FIXED_SESSION),
)


def scrubbed(saved: dict) -> dict:
    """A recorded request without what names the machine that recorded it: its temporary
    working directory, kernel version, device id and session id."""
    text = json.dumps(saved)
    for pattern, replacement in _SCRUB:
        text = pattern.sub(replacement, text)
    return json.loads(text)


def load_recording(path: Path) -> dict:
    """A recorded Claude Code request body (a --record file, or a bare body)."""
    saved = json.loads(path.read_text())
    body = saved.get("body", saved)
    if billing_block(body) is None:
        raise SystemExit(f"{path}: no Claude Code billing block in its system blocks")
    return body


def session_body(recorded: dict, session: int) -> dict:
    """Session `session`'s first request: its own billing XYZ and first user message."""
    body = with_billing(recorded, version_suffix=f"{(0x417 + 0x9D * session) % 0x1000:03x}")
    last = next(m for m in reversed(body["messages"]) if m["role"] == "user")
    question = f"Session {session}: reply with the single word: hello"
    if isinstance(last["content"], str):
        last["content"] = question
    else:
        texts = [b for b in last["content"] if b.get("type") == "text"]
        texts[-1]["text"] = question
    return body


def next_turn(body: dict, turn: int) -> dict:
    """The request after `body`'s: a fixed assistant reply, then a new user message."""
    prompt = LATER_TURNS[(turn - 2) % len(LATER_TURNS)]
    messages = [
        *body["messages"],
        {"role": "assistant", "content": ASSISTANT_REPLY},
        {"role": "user", "content": prompt},
    ]
    return {**body, "messages": messages}


# ------------------------------------------------------------ the client


@dataclass
class Turn:
    session: int
    turn: int
    ttft_s: float
    total_s: float
    prompt_tokens: int | None
    cached_tokens: int | None


def _first_token(event: dict) -> bool:
    for choice in event.get("choices") or []:
        delta = choice.get("delta") or {}
        if any(delta.get(k) for k in ("content", "reasoning_content", "reasoning", "tool_calls")):
            return True
        if choice.get("finish_reason"):
            return True
    return False


async def stream_turn(
    http: aiohttp.ClientSession, url: str, chat: dict
) -> tuple[float, float, dict]:
    """POST a streamed chat request; (time to first token, total time, usage fields)."""
    start = time.monotonic()
    ttft, events = None, []
    async with http.post(f"{url}/v1/chat/completions", json=chat) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{resp.status}: {(await resp.text())[:500]}")
        async for raw in resp.content:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            event = json.loads(line[5:])
            events.append(event)
            if ttft is None and _first_token(event):
                ttft = time.monotonic() - start
    total = time.monotonic() - start
    usage = chat_usage(events)
    return (ttft if ttft is not None else total), total, usage or {}


async def run_session(
    http, url: str, model: str, recorded: dict, session: int, turns: int, max_tokens: int
) -> list[Turn]:
    body, out = session_body(recorded, session), []
    for turn in range(1, turns + 1):
        if turn > 1:
            body = next_turn(body, turn)
        chat = anthropic_to_chat({**body, "model": model}, max_tokens)
        ttft, total, usage = await stream_turn(http, url, chat)
        out.append(
            Turn(
                session,
                turn,
                round(ttft, 3),
                round(total, 3),
                usage.get("prompt"),
                usage.get("cached"),
            )
        )
    return out


async def replay(url: str, model: str, recorded: dict, args) -> dict:
    """The first wave, then the new sessions, against one started server."""
    timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        warm = {
            "model": model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
            "stream": True,
        }
        await stream_turn(http, url, warm)  # lazy set-up is not the agent's first token
        wave = await asyncio.gather(
            *(
                run_session(http, url, model, recorded, s, args.turns, args.max_tokens)
                for s in range(args.sessions)
            )
        )
        fresh = await asyncio.gather(
            *(
                run_session(http, url, model, recorded, s, 1, args.max_tokens)
                for s in range(args.sessions, args.sessions + args.new_sessions)
            )
        )
    return summarize([t for s in wave for t in s], [t for s in fresh for t in s])


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def summarize(wave: list[Turn], fresh: list[Turn]) -> dict:
    firsts, laters = [t for t in wave if t.turn == 1], [t for t in wave if t.turn > 1]
    return {
        "first_wave_first_turn_s": _median([t.ttft_s for t in firsts]),
        "later_turns_p50_s": _median([t.ttft_s for t in laters]),
        "new_session_first_turn_s": _median([t.ttft_s for t in fresh]),
        "prompt_tokens_first_turn": _median([t.prompt_tokens for t in firsts if t.prompt_tokens]),
        "turns": [vars(t) | {"wave": "new" if t in fresh else "first"} for t in wave + fresh],
    }


# ------------------------------------------------------------ the servers


async def served_model(url: str, spec_model: str | None) -> str:
    if spec_model:
        return spec_model
    async with aiohttp.ClientSession() as http, http.get(f"{url}/v1/models") as resp:
        return (await resp.json())["data"][0]["id"]


async def run_server(name: str, model_dir: Path, recorded: dict, args) -> dict:
    from scripts.loadgen.compare import baseline_env
    from scripts.loadgen.configs import service_spec
    from scripts.loadgen.services import Service, ServiceFailed

    spec = service_spec(
        CONFIG_OF[name],
        model_dir,
        model_dir,
        launch_cmd=f"{sys.executable} -m fleet.launch",
        extra_launch_args=args.launch_args,
        baseline_env=baseline_env(),
    )
    spec.env.setdefault("PYTHONPATH", str(ROOT))
    if name == "vllm_mlx":
        forget_vllm_mlx_prefixes(model_dir)
    log = args.log_dir / f"{name}-{time.strftime('%H%M%S')}.log"
    say(f"{name}: starting ({log})")
    service = Service(spec, log)
    try:
        took = await service.wait_healthy(args.start_timeout)
        say(f"{name}: healthy after {took:.0f}s; replaying")
        result = await replay(spec.url, await served_model(spec.url, spec.model), recorded, args)
    except (ServiceFailed, RuntimeError, aiohttp.ClientError) as e:
        say(f"{name}: FAILED: {e}")
        result = {"failed": str(e)[-1000:]}
    finally:
        service.stop()
    return result


def forget_vllm_mlx_prefixes(model_dir: Path) -> None:
    """vllm-mlx saves its prefix cache at exit and loads it at start (~/.cache/vllm-mlx/
    prefix_cache/<model path, / as -->): every server here starts cold, so drop it."""
    saved = Path.home() / ".cache" / "vllm-mlx" / "prefix_cache" / str(model_dir).replace("/", "--")
    shutil.rmtree(saved, ignore_errors=True)


def combine(name: str, rounds: list[dict], model: str) -> dict:
    """One server's line: each metric's median over the rounds that finished."""
    done = [r for r in rounds if "failed" not in r]
    row = {"server": name, "model": model, "rounds": len(rounds), "finished": len(done)}
    for key in (*METRICS, "prompt_tokens_first_turn"):
        values = [r[key] for r in done if r.get(key) is not None]
        row[key] = _median(values)
        if len(values) > 1:
            row[key + "_rounds"] = values
    cached = [
        (t["cached_tokens"], t["prompt_tokens"])
        for r in done
        for t in r["turns"]
        if t["wave"] == "new" and t["prompt_tokens"]
    ]
    row["new_session_cached_tokens"] = cached or None  # as the server reported them
    if failures := [r["failed"] for r in rounds if "failed" in r]:
        row["failed"] = failures
    if done:
        row["turns"] = done[-1]["turns"]
    return row


def ratios(rows: dict[str, dict]) -> dict | None:
    """The best peer's time over ours, per metric (above 1: ours is faster)."""
    ours = rows.get("fleet")
    peers = [r for n, r in rows.items() if n != "fleet"]
    if not ours or not peers:
        return None
    out = {"ratios": "best peer's time / the fleet's (above 1: the fleet is faster)"}
    for key in METRICS:
        times = [(p[key], p["server"]) for p in peers if p.get(key)]
        if ours.get(key) and times:
            best, who = min(times)
            out[key] = round(best / ours[key], 2)
            out[key + "_best_peer"] = who
    return out


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="bench_agents",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--servers",
        default=",".join(SERVERS),
        help="comma-separated subset of fleet, mlx_lm, vllm_mlx (vllm_mlx needs "
        "scripts/setup-vllm-mlx) (default: %(default)s)",
    )
    ap.add_argument(
        "--recording",
        type=Path,
        default=FIXTURE,
        help="a recorded Claude Code request (default: the fixture)",
    )
    ap.add_argument(
        "--save-fixture",
        type=Path,
        metavar="RECORDED",
        help="write RECORDED (a check-coding-agents --record file) scrubbed of "
        "paths and ids to --recording's path, and exit",
    )
    ap.add_argument(
        "--model",
        type=Path,
        help="model directory every server serves (default: the tiny long-context "
        "llama, built on first use)",
    )
    ap.add_argument("--sessions", type=int, default=4, help="first wave's sessions (default 4)")
    ap.add_argument("--turns", type=int, default=3, help="turns per session (default 3)")
    ap.add_argument(
        "--new-sessions",
        type=int,
        default=2,
        help="new sessions after the first wave, one turn each (default 2)",
    )
    ap.add_argument("--max-tokens", type=int, default=8, help="tokens per reply (default 8)")
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="rounds (servers interleaved); lines report medians (default 1)",
    )
    ap.add_argument("--start-timeout", type=float, default=600, help="seconds to get healthy")
    ap.add_argument(
        "--launch-args",
        default="--kv-memory 2GiB",
        help="extra launch-cluster arguments (default: %(default)s)",
    )
    ap.add_argument(
        "--log-dir",
        type=Path,
        default=ROOT / "bench-results" / "agents-logs",
        help="servers' logs (default: %(default)s)",
    )
    args = ap.parse_args(argv)
    args.server_names = [s.strip() for s in args.servers.split(",") if s.strip()]
    if bad := [s for s in args.server_names if s not in SERVERS]:
        ap.error(f"unknown server {bad[0]!r}: choose from {', '.join(SERVERS)}")
    if "vllm_mlx" in args.server_names and not args.save_fixture:
        from scripts.loadgen.configs import vllm_mlx_executable

        if vllm_mlx_executable() is None:
            ap.error(
                "vllm_mlx is not installed: run scripts/setup-vllm-mlx, or set "
                "MLX_FLEET_VLLM_MLX to its executable"
            )
    return args


async def bench(args) -> int:
    recorded = load_recording(args.recording)
    model_dir = args.model or long_context_model()
    model = str(args.model) if args.model else f"{LONG_CONTEXT_MODEL} ({model_dir})"
    rounds: dict[str, list[dict]] = {name: [] for name in args.server_names}
    for r in range(1, args.repeats + 1):
        for name in args.server_names:
            say(f"round {r}/{args.repeats}: {name}")
            rounds[name].append(await run_server(name, model_dir, recorded, args))
    rows = {name: combine(name, rs, model) for name, rs in rounds.items()}
    for row in rows.values():
        print(json.dumps(row), flush=True)
    if (line := ratios(rows)) is not None:
        print(json.dumps(line), flush=True)
    return 1 if any("failed" in row for row in rows.values()) else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.save_fixture:
        saved = scrubbed(json.loads(args.save_fixture.read_text()))
        args.recording.parent.mkdir(parents=True, exist_ok=True)
        args.recording.write_text(json.dumps(saved, indent=1) + "\n")
        say(f"wrote {args.recording}")
        return 0
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    return asyncio.run(bench(args))


if __name__ == "__main__":
    sys.exit(main())
