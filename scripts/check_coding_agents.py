"""The real coding agents, several turns each, against the cluster: does their prompt stay in
the cache from one request to the next, a new session's first request included? (issues #20, #48)

Claude Code (`claude -p`, ANTHROPIC_BASE_URL) and Codex CLI (`codex exec`, a custom provider
with wire_api = "responses") are installed with npm into .agents/ (git ignores it) when missing.
Claude Code runs three turns (`claude -p`, then `claude -c -p` twice) and then a second session
(`claude -p`, another first message); Codex runs three turns (`codex exec`, then
`codex exec resume --last` twice). Every request goes through a recording proxy in front of the
router, which keeps its headers, body, status and the usage the server reported in the reply
(SSE streams parsed): Anthropic's prompt is input_tokens + cache_read_input_tokens +
cache_creation_input_tokens, of which cache_read_input_tokens were cached; Responses' is
usage.input_tokens, of which input_tokens_details.cached_tokens. Then two recorded Claude Code
requests that differ only in the billing block's `cch=` value are replayed.

The check fails (exit 1, saying why) on a protocol error (a 4xx/5xx or an error event in a
stream), or when a turn request other than each agent's very first reads less than 90% of its
prompt from cache, or when the second `cch` replay does. A turn request is one carrying the
agent's tool list; an agent's side requests (a title, a quota probe) are listed, not judged.

Without --url it starts `launch-cluster --workers 1` on a free port serving a tiny random-weight
llama with a 32k context and SmolLM2's tokenizer (Claude Code's own prompt is ~21k tokens, past
the default model's 8,192; the tiny model prefills it in seconds): what it answers does not
matter. `--record DIR` writes every request (headers and body) there, one JSON file each, for
scripts/bench_agents.py to replay.

Run by scripts/check-coding-agents.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from aiohttp import ClientSession, ClientTimeout, web

ROOT = Path(__file__).resolve().parent.parent
AGENTS = ROOT / ".agents"
BIN = AGENTS / "node_modules" / ".bin"
PACKAGES = ("@openai/codex", "@anthropic-ai/claude-code")
# Codex CLI sends no max_output_tokens: the cluster this script starts caps every reply
# (router.max_tokens_cap), so a tiny model that rambles ends by length, not after minutes.
MAX_TOKENS_CAP = 256
CACHED_SHARE = 0.9
CLAUDE_TURNS = (
    "Reply with the single word: hello",
    "Now reply with the single word: again",
    "Last one: reply with the single word: done",
)
CLAUDE_NEW_SESSION = "What is two plus two? Answer with a number."
CODEX_TURNS = CLAUDE_TURNS
SECRET_HEADERS = ("authorization", "x-api-key")
HOP_HEADERS = ("host", "content-length", "transfer-encoding", "connection")


def install() -> None:
    if (BIN / "codex").exists() and (BIN / "claude").exists():
        return
    subprocess.run(["npm", "install", "--prefix", str(AGENTS), *PACKAGES], check=True)


def version(tool: str) -> str:
    out = subprocess.run([str(BIN / tool), "--version"], capture_output=True, text=True)
    return (out.stdout or out.stderr).strip().splitlines()[-1]


# ------------------------------------------------------------ the model

# Claude Code's prompt (~21k tokens) is past the default model's 8,192 tokens of context, and a
# 21k-token prefill of SmolLM2-135M takes minutes on two CPU cores. A llama of two 64-wide layers
# (one attention head) with SmolLM2's tokenizer and chat template tokenizes and templates exactly
# as the default model does and fits the prompt. Its weights are random but for one path that
# makes it answer end-of-sequence first, at any temperature: a rambling random model runs every
# turn to the token cap, and the agents then retry ("Output token limit hit. Resume directly")
# and exit 1 (measured: 4 requests per Claude Code turn, ~40 s, instead of one).
LONG_CONTEXT = 32768
LONG_CONTEXT_CONFIG = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "num_attention_heads": 1,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "rms_norm_eps": 1e-5,
    "vocab_size": 49152,
    "rope_theta": 100000.0,
    "max_position_embeddings": LONG_CONTEXT,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
LONG_CONTEXT_MODEL = (
    "tiny random-weight llama (2 layers, 64 wide, 32768 context, answers end-of-sequence) "
    "with SmolLM2's tokenizer and a ChatML template that renders tools"
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
# SmolLM2's ChatML, with tools: its own template renders none, and mlx_lm.server and vllm-mlx
# then drop them (a 1.5k-token prompt where ours, which writes them into the system prompt,
# sees 19.6k). Here every server sends the tools through the template: the same ~20k tokens,
# the system message (the billing block first) at the head, the tools after it.
TOOLS_CHATML = """\
{%- if tools and (not messages or messages[0]['role'] != 'system') -%}
<|im_start|>system
{{ tools_text(tools) }}<|im_end|>
{% endif -%}
{%- for message in messages -%}
{%- if loop.first and message['role'] == 'system' -%}
<|im_start|>system
{{ message['content'] }}{% if tools %}

{{ tools_text(tools) }}{% endif %}<|im_end|>
{% elif message['role'] == 'tool' -%}
<|im_start|>user
<tool_response>
{{ message['content'] }}
</tool_response><|im_end|>
{% else -%}
<|im_start|>{{ message['role'] }}
{{ message['content'] or '' }}
{%- for call in message['tool_calls'] or [] %}
<tool_call>
{"name": "{{ call['function']['name'] }}", "arguments": {{ call['function']['arguments'] if call['function']['arguments'] is string else call['function']['arguments'] | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% endif -%}"""
TOOLS_TEXT_MACRO = """\
{%- macro tools_text(tools) -%}
# Tools

You may call one or more functions. Their signatures, one per line:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>

For each call, answer <tool_call>{"name": NAME, "arguments": {...}}</tool_call>.
{%- endmacro -%}
"""


def long_context_model(directory: Path | None = None) -> Path:
    """The tiny long-context llama's directory: built once (seed 0) in the model cache."""
    from shared.models.store import cache_dir, resolve_model

    directory = directory or cache_dir() / "models" / "agents-tiny-llama-32k-tools"
    if (directory / "model.safetensors").exists():
        return directory
    import mlx.core as mx
    from mlx.utils import tree_flatten

    source = resolve_model(None)
    building = directory.with_name(directory.name + ".partial")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy2(source / name, building / name)
    tokenizer_config = json.loads((building / "tokenizer_config.json").read_text())
    tokenizer_config["model_max_length"] = LONG_CONTEXT
    tokenizer_config["chat_template"] = TOOLS_TEXT_MACRO + TOOLS_CHATML
    (building / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1))
    mx.random.seed(0)
    weights = dict(tree_flatten(eos_first_llama().parameters()))
    mx.save_safetensors(str(building / "model.safetensors"), weights)
    (building / "config.json").write_text(json.dumps(LONG_CONTEXT_CONFIG, indent=1))
    building.rename(directory)
    return directory


def eos_first_llama():
    """Random weights, except: every embedding holds 8.0 in channel 0, no layer writes that
    channel, and the head reads only it, into the end-of-sequence logit (~800, the rest 0)."""
    import mlx.core as mx
    from mlx_lm.models.llama import Model, ModelArgs

    model = Model(ModelArgs.from_dict(LONG_CONTEXT_CONFIG))
    embed = model.model.embed_tokens
    embed.weight = embed.weight.at[:, 0].add(8.0 - embed.weight[:, 0])
    for layer in model.model.layers:
        for proj in (layer.self_attn.o_proj, layer.mlp.down_proj):
            proj.weight = proj.weight.at[0, :].multiply(0.0)
    head = mx.zeros_like(model.lm_head.weight)
    model.lm_head.weight = head.at[LONG_CONTEXT_CONFIG["eos_token_id"], 0].add(100.0)
    return model


# ------------------------------------------------------------ usage, as each API reports it


class Usage(dict):
    """{"prompt": tokens, "cached": tokens read from cache}, plus the raw fields."""

    @property
    def share(self) -> float | None:
        return self["cached"] / self["prompt"] if self.get("prompt") else None


def sse_events(text: str) -> list[dict]:
    """The JSON objects of an SSE stream's `data:` lines (a plain JSON body: itself)."""
    if not text.lstrip().startswith(("event:", "data:", ":")):
        try:
            return [json.loads(text)]
        except ValueError:
            return []
    events = []
    for line in text.splitlines():
        if line.startswith("data:") and (data := line[5:].strip()) and data != "[DONE]":
            try:
                events.append(json.loads(data))
            except ValueError:
                continue
    return events


def anthropic_usage(events: list[dict]) -> Usage | None:
    """Messages: message_start's usage updated by message_delta's (or a plain reply's)."""
    fields: dict = {}
    for event in events:
        usage = (event.get("message") or {}).get("usage") or event.get("usage")
        if isinstance(usage, dict):
            fields.update({k: v for k, v in usage.items() if isinstance(v, int)})
    if "input_tokens" not in fields:
        return None
    read = fields.get("cache_read_input_tokens", 0)
    written = fields.get("cache_creation_input_tokens", 0)
    return Usage(fields, prompt=fields["input_tokens"] + read + written, cached=read)


def responses_usage(events: list[dict]) -> Usage | None:
    """Responses: the usage of response.completed (or of a plain reply)."""
    for event in reversed(events):
        usage = (event.get("response") or event).get("usage")
        if isinstance(usage, dict) and "input_tokens" in usage:
            cached = (usage.get("input_tokens_details") or {}).get("cached_tokens") or 0
            return Usage(usage, prompt=usage["input_tokens"], cached=cached)
    return None


def chat_usage(events: list[dict]) -> Usage | None:
    """Chat Completions: the (last) chunk carrying usage."""
    for event in reversed(events):
        usage = event.get("usage")
        if isinstance(usage, dict) and "prompt_tokens" in usage:
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            return Usage(usage, prompt=usage["prompt_tokens"], cached=cached)
    return None


def usage_of(path: str, reply: str) -> Usage | None:
    """The usage a reply on `path` reported, counted as that API counts it."""
    events = sse_events(reply)
    if path.startswith("/v1/messages"):
        return anthropic_usage(events)
    if path.startswith("/v1/responses"):
        return responses_usage(events)
    if path.startswith("/v1/chat/completions"):
        return chat_usage(events)
    return None


# ------------------------------------------------------------ Claude Code's billing block

BILLING_PREFIX = "x-anthropic-billing-header:"
_CCH = re.compile(r"cch=[0-9a-fA-F]+;")
_VERSION_SUFFIX = re.compile(r"(cc_version=\d+\.\d+\.\d+\.)[0-9a-fA-F]+")


def billing_block(body: dict) -> dict | None:
    """The system text block that carries Claude Code's billing header, if any."""
    system = body.get("system")
    if not isinstance(system, list):
        return None
    return next(
        (
            b
            for b in system
            if isinstance(b, dict) and str(b.get("text", "")).startswith(BILLING_PREFIX)
        ),
        None,
    )


def with_billing(body: dict, *, cch: str | None = None, version_suffix: str | None = None) -> dict:
    """A copy of `body` whose billing block carries `cch=<cch>;` (replaced or added) and/or
    `cc_version=V.<version_suffix>`; the body unchanged where there is no billing block."""
    body = json.loads(json.dumps(body))
    block = billing_block(body)
    if block is None:
        return body
    text = block["text"]
    if version_suffix is not None:
        text = _VERSION_SUFFIX.sub(lambda m: m[1] + version_suffix, text)
    if cch is not None:
        text = _CCH.sub(f"cch={cch};", text) if _CCH.search(text) else f"{text} cch={cch};"
    block["text"] = text
    return body


# ------------------------------------------------------------ recording proxy


@dataclass
class Label:
    agent: str
    session: int
    turn: int


class Recorder:
    """A proxy in front of the router that keeps what each agent asked and got.

    Each request is labelled with the agent, session and turn the driver set (`label`); with
    `record_dir`, its headers (secrets redacted) and body are written there as NNN-....json."""

    def __init__(self, upstream: str, record_dir: Path | None = None):
        self.upstream = upstream.rstrip("/")
        self.record_dir = record_dir
        self.requests: list[dict] = []
        self.label = Label("none", 0, 0)
        self.port = 0
        self._ready = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True).start()
        self._ready.wait(10)

    async def _serve(self) -> None:
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_route("*", "/{path:.*}", self._forward)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        self._ready.set()
        await asyncio.Event().wait()

    def _keep(self, request: web.Request, body: bytes) -> dict:
        label = self.label
        record = {
            "n": len(self.requests) + 1,
            "agent": label.agent,
            "session": label.session,
            "turn": label.turn,
            "method": request.method,
            "path": request.path_qs,
        }
        self.requests.append(record)
        if self.record_dir is not None:
            headers = {
                k: ("<redacted>" if k.lower() in SECRET_HEADERS else v)
                for k, v in request.headers.items()
                if k.lower() not in HOP_HEADERS
            }
            try:
                parsed = json.loads(body) if body else None
            except ValueError:
                parsed = body.decode(errors="replace")
            name = f"{record['n']:03d}-{label.agent}-s{label.session}-t{label.turn}.json"
            saved = {**record, "headers": headers, "body": parsed}
            (self.record_dir / name).write_text(json.dumps(saved, indent=1))
        return record

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        record = self._keep(request, body)
        record["turn_request"] = _carries_tools(body)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        async with (
            ClientSession(timeout=ClientTimeout(total=1800)) as s,
            s.request(
                request.method, self.upstream + request.path_qs, data=body, headers=headers
            ) as up,
        ):
            record["status"] = up.status
            ctype = up.headers.get("Content-Type", "")
            resp = web.StreamResponse(status=up.status, headers={"Content-Type": ctype})
            await resp.prepare(request)
            reply, client_gone = bytearray(), False
            async for chunk in up.content.iter_any():
                reply += chunk
                if not client_gone:
                    # Codex closes its stream at response.completed: read the rest for usage
                    try:
                        await resp.write(chunk)
                    except ConnectionResetError:
                        client_gone = True
            text = reply.decode(errors="replace")
            if "event: error" in text or '"type": "error"' in text or '"type":"error"' in text:
                record["stream_error"] = text[-500:]
            if up.status >= 400:
                record["error"] = text[-500:]
            if (usage := usage_of(request.path, text)) is not None:
                record["prompt_tokens"], record["cached_tokens"] = usage["prompt"], usage["cached"]
                record["usage"] = {k: v for k, v in usage.items() if k not in ("prompt", "cached")}
                record["share"] = round(usage.share, 3) if usage.share is not None else None
            if not client_gone:
                with contextlib.suppress(ConnectionResetError):
                    await resp.write_eof()
            return resp


def _carries_tools(body: bytes) -> bool:
    try:
        return bool(json.loads(body).get("tools"))
    except (ValueError, AttributeError):
        return False


# ------------------------------------------------------------ the agents


def codex_home(work: Path, base: str, model: str) -> Path:
    home = work / "codex-home"
    home.mkdir(exist_ok=True)
    (home / "config.toml").write_text(
        f'model = "{model}"\nmodel_provider = "fleet"\nsandbox_mode = "read-only"\n\n'
        f'[model_providers.fleet]\nname = "mlx-fleet"\nbase_url = "{base}/v1"\n'
        'wire_api = "responses"\nenv_key = "FLEET_API_KEY"\n'
    )
    return home


def codex_turns(base: str, model: str, work: Path) -> list[tuple[Label, list[str], dict]]:
    """Three turns of one Codex session: `codex exec`, then `codex exec resume --last` twice."""
    env = {
        **os.environ,
        "CODEX_HOME": str(codex_home(work, base, model)),
        "FLEET_API_KEY": "unused",
    }
    # web_search (a hosted tool) and the multi-agent and goals tools (a `namespace` tool
    # among them) are off: /v1/responses serves function tools and refuses the others by name
    common = [
        "--skip-git-repo-check",
        "-c",
        'web_search="disabled"',
        "--disable",
        "multi_agent",
        "--disable",
        "goals",
    ]
    codex = str(BIN / "codex")
    first = [codex, "exec", *common, "-C", str(work), CODEX_TURNS[0]]
    steps = [(Label("codex-cli", 1, 1), first, env)]
    for turn, prompt in enumerate(CODEX_TURNS[1:], 2):
        argv = [codex, "exec", "resume", "--last", *common, prompt]
        steps.append((Label("codex-cli", 1, turn), argv, env))
    return steps


def claude_turns(base: str, model: str, work: Path) -> list[tuple[Label, list[str], dict]]:
    """Three turns of one Claude Code session (`-p`, then `-c -p`), then a new session."""
    home = work / "claude-home"
    home.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": base,
        "ANTHROPIC_API_KEY": "unused",
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_SMALL_FAST_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(MAX_TOKENS_CAP),
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    claude = str(BIN / "claude")
    steps = [(Label("claude-code", 1, 1), [claude, "-p", CLAUDE_TURNS[0]], env)]
    for turn, prompt in enumerate(CLAUDE_TURNS[1:], 2):
        steps.append((Label("claude-code", 1, turn), [claude, "-c", "-p", prompt], env))
    steps.append((Label("claude-code", 2, 1), [claude, "-p", CLAUDE_NEW_SESSION], env))
    return steps


AGENT_STEPS = {"claude-code": claude_turns, "codex-cli": codex_turns}
AGENT_TOOL = {"claude-code": "claude", "codex-cli": "codex"}


def _run(cmd: list[str], env: dict, cwd: Path, timeout: int) -> dict:
    started = time.monotonic()
    try:
        out = subprocess.run(
            cmd,
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        code, stdout, stderr = out.returncode, out.stdout, out.stderr
    except subprocess.TimeoutExpired as e:
        code, stdout, stderr = "timeout", e.stdout or "", e.stderr or ""
        stdout, stderr = (s.decode() if isinstance(s, bytes) else s for s in (stdout, stderr))
    return {
        "exit_code": code,
        "seconds": round(time.monotonic() - started, 1),
        "stdout_tail": stdout[-300:],
        "stderr_tail": "\n".join(
            line for line in stderr.splitlines()[-6:] if "bubblewrap" not in line
        ),
    }


def run_agent(agent: str, recorder: Recorder, model: str, work: Path, timeout: int) -> dict:
    """Every turn of `agent`, one after another, each labelled in the recorder."""
    (work / agent).mkdir()
    turns = []
    for label, argv, env in AGENT_STEPS[agent](recorder.url, model, work / agent):
        recorder.label = label
        say(f"{agent} session {label.session} turn {label.turn}: {' '.join(argv[1:3])} ...")
        result = _run(argv, env, work / agent, timeout)
        turns.append({"session": label.session, "turn": label.turn, **result})
        say(f"  exit {result['exit_code']} after {result['seconds']}s")
    return {"agent": agent, "version": version(AGENT_TOOL[agent]), "turns": turns}


# ------------------------------------------------------------ the billing block's cch, replayed


def replay_cch(body: dict, headers: dict, recorder: Recorder) -> None:
    """Two copies of a recorded Claude Code request, differing only in `cch`, sent in turn."""
    kept = {
        k: v
        for k, v in headers.items()
        if k.lower() not in HOP_HEADERS and k.lower() not in SECRET_HEADERS
    }
    kept["x-api-key"] = "unused"
    for turn in (1, 2):
        edited = with_billing(body, cch=secrets.token_hex(3)[:5])
        edited["max_tokens"] = 16
        recorder.label = Label("cch-replay", 1, turn)
        req = urllib.request.Request(
            f"{recorder.url}/v1/messages",
            data=json.dumps(edited).encode(),
            headers=kept,
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=1800) as r:
                r.read()
        except OSError as e:
            say(f"cch replay {turn}: {e}")


# ------------------------------------------------------------ the verdict


def verdict(requests: list[dict]) -> list[str]:
    """Why the check fails (empty: it passes)."""
    why = []
    for r in requests:
        if r.get("status", 0) >= 400 or "stream_error" in r:
            why.append(
                f"request {r['n']} ({r['agent']} {r['path']}): protocol error "
                f"{r.get('status')}: {(r.get('error') or r.get('stream_error'))!r}"
            )
    seen: set[str] = set()
    for r in requests:
        if not r.get("turn_request") and r["agent"] != "cch-replay":
            continue
        first = r["agent"] not in seen
        seen.add(r["agent"])
        if first:
            continue
        share = r.get("share")
        if share is None:
            why.append(f"request {r['n']} ({_where(r)}): no usage in the reply")
        elif share < CACHED_SHARE:
            why.append(
                f"request {r['n']} ({_where(r)}): {r['cached_tokens']} of "
                f"{r['prompt_tokens']} prompt tokens cached ({share:.1%} < 90%)"
            )
    for agent in ("claude-code", "codex-cli", "cch-replay"):
        if agent in {r["agent"] for r in requests} and agent not in seen:
            why.append(f"{agent}: no request carried its tool list")
    return why


def _where(r: dict) -> str:
    return f"{r['agent']} session {r['session']} turn {r['turn']}"


def table(requests: list[dict]) -> str:
    lines = ["  n agent        ses turn endpoint                 status  prompt  cached  share"]
    for r in requests:
        share = f"{r['share']:.1%}" if r.get("share") is not None else "-"
        kind = "" if r.get("turn_request") else "  (side request)"
        lines.append(
            f"{r['n']:3d} {r['agent']:<12} {r['session']:>3} {r['turn']:>4} "
            f"{r['method'] + ' ' + r['path']:<24} {r.get('status', '-'):>6} "
            f"{r.get('prompt_tokens', '-'):>7} {r.get('cached_tokens', '-'):>7} {share:>6}{kind}"
        )
    return "\n".join(lines)


# ------------------------------------------------------------ the cluster


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def wait_healthy(base: str, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                if json.load(r).get("healthy_workers"):
                    return
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit(f"no healthy worker at {base} after {seconds:.0f}s")


def served_model(base: str) -> str:
    with urllib.request.urlopen(f"{base}/v1/models", timeout=10) as r:
        return json.load(r)["data"][0]["id"]


def start_cluster(model_dir: Path, tmp: Path) -> tuple[subprocess.Popen, str]:
    from fleet.launch import free_port

    config = tmp / "fleet.toml"
    config.write_text(f"[router]\nmax_tokens_cap = {MAX_TOKENS_CAP}\n")
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fleet.launch",
            "--workers",
            "1",
            "--port",
            str(port),
            "--model",
            str(model_dir),
            "--config",
            str(config),
            "--kv-memory",
            "1GiB",
            "--log-requests",
            "--log-dir",
            str(tmp),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    return proc, f"http://127.0.0.1:{port}"


def stop_cluster(proc: subprocess.Popen) -> None:
    proc.send_signal(2)
    try:
        proc.wait(timeout=40)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)


def last_claude_turn(record_dir: Path) -> tuple[dict, dict] | None:
    """The body and headers of the last recorded Claude Code turn request."""
    for path in sorted(record_dir.glob("*-claude-code-*.json"), reverse=True):
        saved = json.loads(path.read_text())
        if isinstance(saved.get("body"), dict) and saved["body"].get("tools"):
            return saved["body"], saved["headers"]
    return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="See the module docstring for the rule.",
    )
    ap.add_argument("--url", help="a running router (default: start launch-cluster --workers 1)")
    ap.add_argument(
        "--model",
        type=Path,
        help="model directory the started cluster serves (default: the tiny "
        "long-context llama, built on first use)",
    )
    ap.add_argument(
        "--agent",
        choices=tuple(AGENT_STEPS),
        action="append",
        help="run only this agent (repeatable; default: both)",
    )
    ap.add_argument(
        "--record",
        type=Path,
        metavar="DIR",
        help="write every request's headers and body to DIR, one JSON file each",
    )
    ap.add_argument(
        "--no-cch-replay",
        action="store_true",
        help="skip the replay of two requests differing only in cch",
    )
    ap.add_argument("--timeout", type=int, default=900, help="seconds per agent turn")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    install()
    agents = args.agent or ["claude-code", "codex-cli"]
    with tempfile.TemporaryDirectory(prefix="check-agents-") as tmp_name:
        tmp = Path(tmp_name)
        record_dir = args.record or tmp / "record"
        record_dir.mkdir(parents=True, exist_ok=True)
        proc, base, model_dir = None, args.url, args.model
        if base is None:
            model_dir = model_dir or long_context_model()
            say(f"starting launch-cluster --workers 1 serving {model_dir}")
            proc, base = start_cluster(model_dir, tmp)
        try:
            wait_healthy(base)
            model = served_model(base)
            recorder = Recorder(base, record_dir)
            recorder.start()
            reports = [run_agent(a, recorder, model, tmp, args.timeout) for a in agents]
            replayed = last_claude_turn(record_dir)
            if "claude-code" in agents and not args.no_cch_replay and replayed:
                say("replaying a Claude Code request twice, differing only in cch")
                replay_cch(*replayed, recorder)
        finally:
            if proc is not None:
                stop_cluster(proc)
    requests = recorder.requests
    why = verdict(requests)
    report = {
        "url": base,
        "model": model,
        "model_dir": str(model_dir) if model_dir else None,
        "agents": reports,
        "requests": requests,
        "passed": not why,
        "why": why,
    }
    print(json.dumps(report, indent=1))
    print(table(requests))
    print("PASS" if not why else "FAIL:\n  " + "\n  ".join(why))
    return 1 if why else 0


if __name__ == "__main__":
    sys.exit(main())
