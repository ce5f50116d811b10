"""Children of launch-cluster exit when it dies, on every platform.

Linux has PR_SET_PDEATHSIG (the supervisor sets it); macOS has no such signal, so a child
started by launch-cluster (which puts its own pid in `MLX_FLEET_PARENT_PID`) watches its
parent: once it has been re-parented (the launcher died, even by SIGKILL), it signals itself
SIGTERM and shuts down as if told to.
"""

from __future__ import annotations

import os
import signal
import threading
import time

ENV = "MLX_FLEET_PARENT_PID"
SPAWNED_AT_ENV = "MLX_FLEET_SPAWNED_AT"  # epoch seconds; the child logs its start-up time
POLL_S = 1.0


def watch_parent(poll_s: float = POLL_S) -> threading.Thread | None:
    """Start the watch when launched by launch-cluster; None otherwise."""
    try:
        parent = int(os.environ.get(ENV, ""))
    except ValueError:
        return None

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10 * poll_s)
        os._exit(1)  # the SIGTERM handler did not end the process in time

    thread = threading.Thread(target=watch, daemon=True, name="parent-watch")
    thread.start()
    return thread
