"""A stand-in `launch-cluster` with no model: the real router plus N stand-in workers
(tests/support/fake_worker.py), to dry-run the comparison runner and test it.

    python scripts/compare.py --configs ours-1,ours-2-round_robin \\
        --launch-cmd "python -m scripts.loadgen.fake_cluster --token-delay 0.01"

Takes launch-cluster's options (--workers --policy --model --host --port); stops its
children on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading

from scripts.loadgen.services import ROOT, free_port


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fake_cluster", description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--policy", default="cache_aware")
    p.add_argument("--model", required=True, help="a model directory (only its tokenizer)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--token-delay", type=float, default=0.0, help="stand-in seconds per token")
    p.add_argument("--context-length", type=int, default=8192)
    args = p.parse_args(argv)
    zmq = f"tcp://127.0.0.1:{free_port()}"
    router = [
        *("router", "--model", args.model, "--host", args.host, "--port", str(args.port)),
        *("--zmq-bind", zmq, "--policy", args.policy, "--log-level", "WARNING"),
        *("--context-length", str(args.context_length)),
    ]
    workers = [
        ["tests.support.fake_worker", "--connect", zmq, "--worker-id", f"w{i}"]
        + ["--token-delay", str(args.token_delay)]
        for i in range(args.workers)
    ]
    procs = [subprocess.Popen([sys.executable, "-m", *a], cwd=ROOT) for a in [router, *workers]]
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"fake cluster at http://{args.host}:{args.port}", flush=True)
    while not stop.wait(0.2):
        if any(p.poll() is not None for p in procs):
            break
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
