"""Progress on stderr: one updating line on a terminal, a line per 10% otherwise."""

from __future__ import annotations

import sys
import time


class ProgressLine:
    def __init__(self, label: str, stream=None):
        self.label = label
        self.stream = stream or sys.stderr
        self._tty = self.stream.isatty()
        self._start = time.perf_counter()
        self._last_decile = -1

    def __call__(self, done: int, total: int) -> None:
        elapsed = time.perf_counter() - self._start
        text = f"{self.label}: {done}/{total} requests, {elapsed:.0f}s"
        if self._tty:
            end = "\n" if done == total else ""
            self.stream.write(f"\r\033[K{text}{end}")
        elif (decile := done * 10 // max(total, 1)) != self._last_decile:
            self._last_decile = decile
            self.stream.write(text + "\n")
        self.stream.flush()
