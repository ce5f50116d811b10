#!/usr/bin/env python
"""Which mlx-lm architectures the worker serves: every config of the architecture zoo
(tests/support/arch_zoo), built with random weights, saved as a model directory and loaded
as a worker loads one (`Engine.from_path`: mlx-lm's loader, the load-time checks, the vision
side where the config has one), then three prompts (5, 23 and 41 tokens) decoded together,
greedy, 6 tokens each, and compared with mlx-lm's own `generate_step`.

Each architecture gets a status:
  served   the engine's tokens equal mlx-lm's for all three prompts
  wrong    it loaded, but some prompt's tokens differ
  refused  the engine refused it at load (`UnsupportedModel`; its message is kept)
  crash    any other exception at load or run, a fatal signal, or no answer within --timeout

Each architecture runs in a subprocess of its own, so a hang or a crash costs only its row.
Writes docs/models.md (a generated file: rerun this script, do not edit it) and, with --json,
the results as JSON. Needs no network.

  scripts/model_matrix.py                     # the whole zoo, into docs/models.md
  scripts/model_matrix.py --only llama,mamba --out /tmp/m.md --json /tmp/m.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scripts.model_matrix_report import Result, render  # noqa: E402

PROMPT_LENGTHS = (5, 23, 41)
MAX_TOKENS = 6
COMMAND = "scripts/model_matrix.py"


def prompts(vocab_size: int) -> list[list[int]]:
    """The three prompts, fixed ids below the vocabulary."""
    rng = random.Random(0)
    return [[rng.randrange(1, vocab_size) for _ in range(n)] for n in PROMPT_LENGTHS]


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def decode_batched(engine, batch: list[list[int]]) -> tuple[list[list[int]], dict]:
    """The engine's greedy tokens for `batch`, all requests added before the first step."""
    from shared.sampling import SamplingParams
    from tests.support.engine_fixtures import drive

    for i, prompt in enumerate(batch):
        engine.add_request(f"p{i}", prompt, SamplingParams(max_tokens=MAX_TOKENS))
    outputs: dict[str, list[int]] = {}
    errors: dict[str, str] = {}
    drive(engine, outputs, errors)
    return [outputs.get(f"p{i}", []) for i in range(len(batch))], errors


def compare(got: list[list[int]], expected: list[list[int]]) -> str:
    """Which prompts differ, the first of them with both token lists: one line."""
    bad = [i for i in range(len(expected)) if got[i] != expected[i]]
    first = bad[0]
    lengths = ", ".join(str(PROMPT_LENGTHS[i]) for i in bad)
    return (
        f"{len(bad)} of {len(expected)} prompts differ (lengths {lengths}); "
        f"{PROMPT_LENGTHS[first]}-token prompt: engine {got[first]} vs mlx-lm {expected[first]}"
    )


def check(name: str) -> dict:
    """Build `name`, save it as a model directory, load that as a worker does
    (`Engine.from_path`), decode, compare with mlx-lm's own load of the same directory (a
    loader's `sanitize` may change weights: baichuan_m1 normalizes its head): one result."""
    import tempfile

    from tests.support.arch_zoo import build, cache_kinds, is_recurrent

    model = build(name)
    base = {"cache": sorted(set(cache_kinds(model))), "recurrent": is_recurrent(model)}
    with tempfile.TemporaryDirectory(prefix=f"matrix-{name}-") as directory:
        return {**base, **check_directory(name, Path(directory) / name)}


def check_directory(name: str, directory: Path) -> dict:
    from mlx_lm import load

    from tests.support.arch_zoo import ARCHITECTURES
    from tests.support.arch_zoo.saved import save
    from tests.support.engine_fixtures import load_engine, reference_greedy
    from worker.runner.model_support import UnsupportedModel

    try:
        engine = load_engine(save(name, directory))
    except UnsupportedModel as exc:
        return {"status": "refused", "detail": " ".join(str(exc).split())}
    except Exception as exc:
        return {"status": "crash", "detail": f"at load: {one_line(exc)}"}
    batch = prompts(ARCHITECTURES[name].get("vocab_size", 128))
    try:
        got, errors = decode_batched(engine, batch)
        reference = load(str(directory))[0]
        expected = [reference_greedy(reference, p, MAX_TOKENS) for p in batch]
    except Exception as exc:
        return {"status": "crash", "detail": f"at run: {one_line(exc)}"}
    if errors:
        rid, error = sorted(errors.items())[0]
        detail = f"at run: request {rid} ended in error: {' '.join(error.split())}"
        return {"status": "crash", "detail": detail}
    if got != expected:
        return {"status": "wrong", "detail": compare(got, expected)}
    detail = (
        f"prompts of {'/'.join(map(str, PROMPT_LENGTHS))} tokens batched, {MAX_TOKENS} greedy "
        "tokens each = mlx-lm generate_step"
    )
    return {"status": "served", "detail": detail}


def run_child(name: str) -> None:
    """`--child NAME`: print the one result as the last line of stdout."""
    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        result = check(name)
    except Exception as exc:
        result = {"status": "crash", "detail": f"at build: {one_line(exc)}"}
    print(json.dumps(result), flush=True)


def run_one(name: str, timeout: float) -> Result:
    """`name` in a subprocess of its own; a crash, signal or timeout becomes its result."""
    start = time.perf_counter()
    command = [sys.executable, str(Path(__file__).resolve()), "--child", name]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        payload = {"status": "crash", "detail": f"no result within {timeout:.0f} s (hung?)"}
    else:
        payload = child_payload(proc)
    return Result(name=name, seconds=time.perf_counter() - start, **payload)


def child_payload(proc: subprocess.CompletedProcess) -> dict:
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines:
        try:
            return json.loads(lines[-1])
        except json.JSONDecodeError:
            pass
    if proc.returncode < 0:
        detail = f"killed by {signal.Signals(-proc.returncode).name}"
    else:
        detail = f"exit status {proc.returncode}"
    tail = proc.stderr.strip().splitlines()[-1:] or ["(no stderr)"]
    return {"status": "crash", "detail": f"process {detail}: {' '.join(tail[0].split())}"}


def sweep(names: list[str], timeout: float, jobs: int) -> list[Result]:
    """Every architecture in `names`, `jobs` subprocesses at a time; a progress line each."""
    done: dict[str, Result] = {}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(run_one, name, timeout) for name in names]
        for future in as_completed(futures):
            result = future.result()
            done[result.name] = result
            print(
                f"[{len(done)}/{len(names)}] {result.name:22s} {result.status:8s} "
                f"{result.seconds:5.1f}s  {result.detail[:110]}",
                flush=True,
            )
    return [done[name] for name in names]


def versions() -> dict[str, str]:
    from importlib.metadata import version

    return {"mlx-lm": version("mlx-lm"), "mlx": version("mlx")}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
    )
    parser.add_argument("--only", help="comma-separated zoo names (default: the whole zoo)")
    parser.add_argument(
        "--out", type=Path, default=REPO / "docs" / "models.md", help="the Markdown to write"
    )
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    parser.add_argument(
        "--timeout", type=float, default=180.0, help="seconds per architecture (default 180)"
    )
    parser.add_argument(
        "--jobs", type=int, default=1, help="architectures checked at once (default 1)"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one architecture, in-process
    return parser.parse_args(argv)


def selected(only: str | None) -> list[str]:
    from tests.support.arch_zoo import ARCHITECTURES

    if not only:
        return list(ARCHITECTURES)
    names = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in ARCHITECTURES]
    if unknown:
        sys.exit(f"not in the zoo: {', '.join(unknown)} (see tests/support/arch_zoo)")
    return names


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        return run_child(args.child)
    names = selected(args.only)
    start = time.perf_counter()
    results = sweep(names, args.timeout, args.jobs)
    elapsed = time.perf_counter() - start
    command = COMMAND + (f" --only {args.only}" if args.only else "")
    from tests.support.arch_zoo import NOT_BUILT

    args.out.write_text(render(results, NOT_BUILT, versions(), command, elapsed))
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in results], indent=1) + "\n")
    counts = {s: sum(r.status == s for r in results) for s in ("served", "refused", "wrong")}
    counts["crash"] = sum(r.status == "crash" for r in results)
    print(
        json.dumps(
            {
                **counts,
                "recurrent": sum(r.recurrent for r in results),
                "seconds": round(elapsed, 1),
                "out": str(args.out),
            }
        )
    )


if __name__ == "__main__":
    main()
