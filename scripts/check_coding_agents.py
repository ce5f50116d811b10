"""The real coding agents, one non-interactive turn each, against the cluster (issue #20).

Codex CLI (`codex exec`, a custom provider with wire_api = "responses") and Claude Code
(`claude -p`, ANTHROPIC_BASE_URL) are installed with npm into .agents/ (git ignores it) when
missing, then each runs one turn through a recording proxy in front of the router, which keeps
every request's method, path and status (and an error reply's body). A turn has a protocol
error when any request was answered 4xx/5xx or a stream carried an error event. The default
model is tiny (135M parameters, 8192 tokens of context): what it answers does not matter.

Run by scripts/check-coding-agents; prints one JSON report and exits 1 on a protocol error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from aiohttp import ClientSession, ClientTimeout, web

ROOT = Path(__file__).resolve().parent.parent
AGENTS = ROOT / ".agents"
BIN = AGENTS / "node_modules" / ".bin"
PACKAGES = ("@openai/codex", "@anthropic-ai/claude-code")
PROMPT = "Reply with the single word: hello"
# Codex CLI sends no max_output_tokens: the cluster this script starts caps every reply
# (router.max_tokens_cap), so a tiny model that rambles ends by length, not after minutes.
MAX_TOKENS_CAP = 256


def install() -> None:
    if (BIN / "codex").exists() and (BIN / "claude").exists():
        return
    subprocess.run(["npm", "install", "--prefix", str(AGENTS), *PACKAGES], check=True)


def version(tool: str) -> str:
    out = subprocess.run([str(BIN / tool), "--version"], capture_output=True, text=True)
    return (out.stdout or out.stderr).strip().splitlines()[-1]


# ------------------------------------------------------------ recording proxy


class Recorder:
    """A proxy in front of the router that keeps what each agent asked and got."""

    def __init__(self, upstream: str):
        self.upstream = upstream.rstrip("/")
        self.requests: list[dict] = []
        self.port = 0
        self._ready = threading.Event()

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

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        record = {"method": request.method, "path": request.path_qs}
        self.requests.append(record)
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() not in ("host", "content-length")}  # fmt: skip
        async with (
            ClientSession(timeout=ClientTimeout(total=900)) as s,
            s.request(
                request.method, self.upstream + request.path_qs, data=body, headers=headers
            ) as up,
        ):
            record["status"] = up.status
            ctype = up.headers.get("Content-Type", "")
            resp = web.StreamResponse(status=up.status, headers={"Content-Type": ctype})
            await resp.prepare(request)
            tail = b""
            async for chunk in up.content.iter_any():
                tail = (tail + chunk)[-4096:]
                if b"event: error" in chunk or b'"type": "error"' in chunk:
                    record["stream_error"] = chunk.decode(errors="replace")[:500]
                await resp.write(chunk)
            if up.status >= 400:
                record["error"] = tail.decode(errors="replace")[:500]
            await resp.write_eof()
            return resp


# ------------------------------------------------------------ the agents


def run_codex(base: str, model: str, work: Path, timeout: int) -> dict:
    home = work / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(
        f'model = "{model}"\nmodel_provider = "fleet"\n\n[model_providers.fleet]\n'
        f'name = "mlx-fleet"\nbase_url = "{base}/v1"\nwire_api = "responses"\n'
        'env_key = "FLEET_API_KEY"\n'
    )
    # web_search (a hosted tool) and the multi-agent and goals tools (a `namespace` tool
    # among them) are off: /v1/responses serves function tools and refuses the others by name
    cmd = [str(BIN / "codex"), "exec", "--skip-git-repo-check", "--ephemeral",
           "-s", "read-only", "-C", str(work), "-c", 'web_search="disabled"',
           "--disable", "multi_agent", "--disable", "goals", PROMPT]  # fmt: skip
    env = {**os.environ, "CODEX_HOME": str(home), "FLEET_API_KEY": "unused"}
    return _run(cmd, env, work, timeout)


def run_claude(base: str, model: str, work: Path, timeout: int) -> dict:
    home = work / "claude-home"
    home.mkdir()
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
    # Claude Code's own system prompt and 24 tools are 21,090 tokens: past the default model's
    # 8,192 (a 400 context_length_exceeded, the right answer). A short system prompt and no
    # tools keep the turn within it; the protocol (streamed /v1/messages) is the same.
    cmd = [str(BIN / "claude"), "-p", PROMPT, "--tools", "",
           "--system-prompt", "You are a helpful assistant. Answer briefly."]  # fmt: skip
    return _run(cmd, env, work, timeout)


def _run(cmd: list[str], env: dict, cwd: Path, timeout: int) -> dict:
    started = time.monotonic()
    try:
        out = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True,
                             timeout=timeout, stdin=subprocess.DEVNULL)  # fmt: skip
        code, stdout, stderr = out.returncode, out.stdout, out.stderr
    except subprocess.TimeoutExpired as e:
        code, stdout, stderr = "timeout", e.stdout or "", e.stderr or ""
        stdout, stderr = (s.decode() if isinstance(s, bytes) else s for s in (stdout, stderr))
    return {
        "exit_code": code,
        "seconds": round(time.monotonic() - started, 1),
        "stdout_tail": stdout[-600:],
        "stderr_tail": "\n".join(
            line for line in stderr.splitlines()[-8:] if "bubblewrap" not in line
        ),
    }


def check(agent: str, runner, base: str, model: str, timeout: int) -> dict:
    recorder = Recorder(base)
    recorder.start()
    with tempfile.TemporaryDirectory(prefix=f"check-{agent}-") as tmp:
        result = runner(f"http://127.0.0.1:{recorder.port}", model, Path(tmp), timeout)
    failed = [r for r in recorder.requests if r.get("status", 0) >= 400 or "stream_error" in r]
    return {
        "agent": agent,
        "version": version({"codex-cli": "codex", "claude-code": "claude"}[agent]),
        **result,
        "requests": recorder.requests,
        "protocol_error": bool(failed) or not recorder.requests,
        "finished": result["exit_code"] == 0,
    }


# ------------------------------------------------------------ the cluster


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", help="a running router (default: start launch-cluster --workers 1)")
    ap.add_argument("--agent", choices=("codex-cli", "claude-code"), action="append")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per agent")
    args = ap.parse_args()
    install()
    agents = args.agent or ["codex-cli", "claude-code"]
    runners = {"codex-cli": run_codex, "claude-code": run_claude}
    with tempfile.TemporaryDirectory(prefix="check-agents-") as tmp:
        proc, base = None, args.url
        if base is None:
            from fleet.launch import free_port

            config = Path(tmp) / "fleet.toml"
            config.write_text(f"[router]\nmax_tokens_cap = {MAX_TOKENS_CAP}\n")
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            proc = subprocess.Popen(
                [sys.executable, "-m", "fleet.launch", "--workers", "1", "--port", str(port),
                 "--config", str(config), "--kv-memory", "1GiB", "--log-requests",
                 "--log-dir", tmp],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        try:
            wait_healthy(base)
            model = served_model(base)
            reports = [check(a, runners[a], base, model, args.timeout) for a in agents]
            if proc is not None:
                log = (Path(tmp) / "router.log").read_text().splitlines()
                router_lines = [line.split("router.access: ", 1)[1]
                                for line in log if "router.access" in line]  # fmt: skip
            else:
                router_lines = []
        finally:
            if proc is not None:
                proc.send_signal(2)
                try:
                    proc.wait(timeout=40)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, 9)
    print(json.dumps({"url": base, "model": model, "agents": reports,
                      "router_access_log": router_lines}, indent=1))  # fmt: skip
    return 1 if any(r["protocol_error"] for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
