"""launch-cluster's supervisor heals the cluster: dead children come back (the router too),
the first restart at once; and children never outlive the launcher."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from fleet.supervisor import Child, Supervisor
from tests.support.paths import ROOT

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_dead_router_and_worker_are_restarted_first_time_at_once():
    env = dict(os.environ)
    sup = Supervisor(
        Child("router", SLEEPER, env, restart=False), [Child("w0", SLEEPER, env, True)]
    )
    sup.start()
    sup.router.restart = True  # what supervise() sets once the cluster serves
    try:
        for child in (sup.router, sup.workers[0]):
            old = child.proc.pid
            child.proc.kill()
            child.proc.wait()
            died = time.monotonic()
            assert wait_for(lambda c=child, o=old: (sup.poll() or True) and c.proc.pid != o)
            assert time.monotonic() - died < 2.0
            assert child.restarts == 1 and not child.exited
        # a second crash right away backs off
        w = sup.workers[0]
        w.proc.kill()
        w.proc.wait()
        sup.poll()
        assert w.restart_at is not None and w.restart_at - time.monotonic() > 0.5
    finally:
        sup.shutdown()


def test_child_exits_when_the_launcher_dies_even_by_sigkill():
    """The macOS path (no PDEATHSIG): the child polls its parent and stops itself."""
    child_code = (
        "import signal, sys, time\n"
        "from shared.parent_watch import watch_parent\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
        "watch_parent(0.1)\n"
        "time.sleep(60)\n"
    )
    launcher_code = (
        "import os, subprocess, sys, time\n"
        "env = dict(os.environ, MLX_FLEET_PARENT_PID=str(os.getpid()))\n"
        f"p = subprocess.Popen([sys.executable, '-c', {child_code!r}], env=env)\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    launcher = subprocess.Popen(
        [sys.executable, "-c", launcher_code], env=env, stdout=subprocess.PIPE, text=True
    )
    child_pid = int(launcher.stdout.readline())
    time.sleep(0.5)
    assert _alive(child_pid)
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    assert wait_for(lambda: not _alive(child_pid), timeout=5), "the child outlived its launcher"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by init) counts as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_router_that_never_came_up_is_final_but_one_that_did_is_healed():
    env = dict(os.environ)
    sup = Supervisor(Child("router", [sys.executable, "-c", "pass"], env, restart=False), [])
    sup.start()
    try:
        sup.router.proc.wait()
        assert sup.router_dead()  # before it ever answered: a bad config, say; no restart loop
        sup.router.restart = True  # what launch-cluster sets once the router has answered
        assert not sup.router_dead()
        old = sup.router.proc.pid
        assert wait_for(lambda: (sup.poll() or True) and sup.router.proc.pid != old)
    finally:
        sup.shutdown()
