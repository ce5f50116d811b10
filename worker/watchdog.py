"""The worker's watchdog: a thread that ends the process when the engine loop is stuck.

The router takes a worker whose loop stops moving out of service (Heartbeat.loop_turns), but
only the process can end itself: a step stuck inside MLX never returns to the loop. After
`limit_s` without a loop turn the watchdog logs one line and calls `os._exit(WEDGED_EXIT)`,
and launch-cluster's supervisor starts a fresh worker.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

WEDGED_EXIT = 75  # EX_TEMPFAIL: stuck, worth restarting


class LoopWatchdog:
    def __init__(
        self,
        limit_s: float,
        clock: Callable[[], float] = time.monotonic,
        exit: Callable[[int], object] = os._exit,
    ):
        """`limit_s` 0 (or less): never fires."""
        self.limit_s, self._clock, self._exit = limit_s, clock, exit
        self.last_turn = clock()
        self._stop = threading.Event()

    def turned(self) -> None:
        """The loop made a turn (called by the loop thread, every turn: cheap)."""
        self.last_turn = self._clock()

    def check(self) -> bool:
        """Exit the process if the loop has been stuck too long; True if it fired."""
        stuck = self._clock() - self.last_turn
        if self.limit_s <= 0 or stuck <= self.limit_s:
            return False
        log.critical(
            "the engine loop has made no progress for %.0fs (limit %gs): exiting with code %d "
            "for the supervisor to restart this worker",
            stuck,
            self.limit_s,
            WEDGED_EXIT,
        )
        logging.shutdown()
        self._exit(WEDGED_EXIT)
        return True

    def start(self) -> None:
        if self.limit_s > 0:
            threading.Thread(target=self._run, name="loop-watchdog", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self.limit_s / 4)):
            if self.check():
                return
