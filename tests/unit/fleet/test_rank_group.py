"""launch-cluster's RankGroup: the ranks of one tensor-parallel worker start, stop and restart
as one (real processes; each rank here just records its ring settings and sleeps)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from fleet.supervisor import Child, RankGroup, Supervisor

RANK = (  # written whole, then renamed: the test never reads a file half written
    "import json, os, sys, time; "
    "ring = json.load(open(os.environ['MLX_HOSTFILE'])); "
    "path = sys.argv[1] + os.environ['MLX_RANK']; "
    "open(path + '.tmp', 'w').write(json.dumps(ring)); os.replace(path + '.tmp', path); "
    "time.sleep(60)"
)


def wait_for(predicate, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_dead_rank_restarts_its_whole_group_on_fresh_ring_ports(tmp_path):
    group = RankGroup(
        "worker-0", [sys.executable, "-c", RANK, str(tmp_path / "rank")], dict(os.environ), 3
    )
    sup = Supervisor(
        Child(
            "router", [sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ), False
        ),
        [group],
    )
    sup.start()
    try:
        wait_for(lambda: all((tmp_path / f"rank{r}").exists() for r in range(3)))
        first_pids = [p.pid for p in group.processes()]
        first_ring = json.loads((tmp_path / "rank0").read_text())
        assert len(first_ring) == 3 and len({tuple(r) for r in first_ring}) == 3
        for r in range(3):
            (tmp_path / f"rank{r}").unlink()

        os.kill(first_pids[1], signal.SIGKILL)
        wait_for(lambda: (sup.poll(), group.restart_at is not None)[1])
        assert all(p.poll() is not None for p in group.processes())  # the others stopped too
        wait_for(lambda: (sup.poll(), group.restarts == 1)[1])
        wait_for(lambda: all((tmp_path / f"rank{r}").exists() for r in range(3)))
        assert not set(first_pids) & {p.pid for p in group.processes()}
        assert json.loads((tmp_path / "rank2").read_text()) != first_ring
    finally:
        sup.shutdown()
    assert all(p.poll() is not None for p in group.processes())
