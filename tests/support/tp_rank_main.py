"""One rank of a test tensor-parallel group (started by tests/support/tp_group.py, MLX_RANK and
MLX_HOSTFILE in its environment): rank 0 runs the case's requests phase by phase through the
group's Engine and writes the tokens to OUT; the other ranks follow.

    python -m tests.support.tp_rank_main MODEL_DIR CASE.json OUT.json
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

from shared.sampling import SamplingParams
from worker.config import EngineConfig
from worker.tp.runner import init_group
from worker.tp.start import follow, leader_engine, load_sharded


def run_phases(engine, phases: list[list[dict]]) -> dict[str, list[int]]:
    outputs: dict[str, list[int]] = {}
    for phase in phases:
        for r in phase:
            sampling = SamplingParams(max_tokens=r["max_tokens"], temperature=0.0)
            engine.add_request(r["id"], r["prompt"], sampling, r.get("n", 1))
        while engine.has_work():
            for delta in engine.step():
                assert delta.error is None, delta.error
                key = f"{delta.request_id}/{delta.index}"
                outputs.setdefault(key, []).extend(delta.token_ids)
    return outputs


def main(model_dir: str, case_path: str, out_path: str) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s tp-test %(levelname)s %(message)s")
    case = json.loads(Path(case_path).read_text())
    config = EngineConfig(**case["config"])
    timeout_s = case.get("timeout_s", 60)
    group = init_group()
    model, _ = load_sharded(Path(model_dir), config, group)
    if group.rank() != 0:
        return follow(model, config, group, timeout_s)
    engine, leader = leader_engine(model, config, group, case["max_context"], timeout_s)
    outputs = run_phases(engine, case["phases"])
    engine.check_integrity()
    Path(out_path).write_text(
        json.dumps(
            {"outputs": outputs, "stats": engine.stats(), "kv_layout": engine.pool.kv_layout}
        )
    )
    idle_until = time.monotonic() + case.get("idle_s", 0)
    while time.monotonic() < idle_until:  # as a server between requests
        leader.keepalive()
        time.sleep(0.05)
    leader.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
