"""The worker's watchdog exits the process (code WEDGED_EXIT) when the loop stops turning."""

from __future__ import annotations

from worker.watchdog import WEDGED_EXIT, LoopWatchdog


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_fires_only_after_the_loop_is_stuck_past_the_limit(caplog):
    clock, exits = FakeClock(), []
    dog = LoopWatchdog(30.0, clock=clock, exit=exits.append)
    for _ in range(10):  # a loop that turns every 20 s is slow, not stuck
        clock.now += 20
        dog.turned()
        assert not dog.check()
    clock.now += 30
    assert not dog.check() and exits == []
    clock.now += 0.5
    assert dog.check()
    assert exits == [WEDGED_EXIT]
    assert "no progress for 30s" in caplog.text and "code 75" in caplog.text


def test_zero_limit_never_fires():
    clock, exits = FakeClock(), []
    dog = LoopWatchdog(0.0, clock=clock, exit=exits.append)
    clock.now += 1e6
    assert not dog.check() and exits == []
    dog.start()  # no thread: nothing to stop
    dog.stop()


def test_watchdog_thread_exits_a_stuck_loop():
    import threading

    fired = threading.Event()
    dog = LoopWatchdog(0.05, exit=lambda code: fired.set())
    dog.start()
    assert fired.wait(2.0)  # nobody calls turned(): it fires on its own
    dog.stop()
