"""``ClockWatch`` on a server whose clock keeps pace, and on one whose clock steps ahead (a
stand-in client answering ``TIME`` from the monotonic clock plus a step the test sets: the
real clock of this machine cannot be stepped by a test, and a real step is what the watch is
for). What it records is the ``clock`` operation the checker reads (``test_checker``)."""

from __future__ import annotations

import threading
import time

from reactor_app.testing.clock_watch import NOISE_NS, ClockWatch
from reactor_app.testing.history import CLOCK, NEMESIS, History, operations


class SteppingServer:
    """``TIME`` as a Redis client answers it: the monotonic clock, ``ahead_ns`` ahead."""

    def __init__(self) -> None:
        self.ahead_ns = 1_700_000_000_000_000_000  # a wall clock's epoch, roughly
        self.reads = 0
        self.read = threading.Event()

    def time(self) -> tuple[int, int]:
        self.reads += 1
        self.read.set()
        now = time.monotonic_ns() + self.ahead_ns
        return now // 1_000_000_000, (now % 1_000_000_000) // 1_000

    def wait_for_reads(self, count: int) -> None:
        deadline = time.monotonic() + 10
        target = self.reads + count
        while self.reads < target:
            assert time.monotonic() < deadline, "the watch stopped sampling"
            self.read.clear()
            self.read.wait(0.1)


def clock_operation(history: History) -> dict[str, object]:
    (clock,) = [o for o in operations(history.events()) if o.f == CLOCK]
    assert clock.process == NEMESIS and clock.key is None and clock.status == "ok"
    return clock.value


def test_a_clock_that_keeps_pace_records_no_step() -> None:
    server, history = SteppingServer(), History()
    with ClockWatch(history, server, every=0.005):
        server.wait_for_reads(5)
    assert clock_operation(history)["step_ns"] == 0


def test_a_step_ahead_is_recorded_once_the_watch_ends() -> None:
    server, history = SteppingServer(), History()
    watch = ClockWatch(history, server, every=0.005).start()
    server.wait_for_reads(3)
    server.ahead_ns += 350_000_000  # the host paused the VM; its wall clock was set right
    server.wait_for_reads(3)
    assert watch.stop() == clock_operation(history)["step_ns"]
    step = clock_operation(history)["step_ns"]
    assert isinstance(step, int) and 349_000_000 <= step <= 350_000_000
    assert watch.stop() == step  # stopped once; a second stop answers the same


def test_a_step_back_or_within_the_noise_is_not_a_step_ahead() -> None:
    server, history = SteppingServer(), History()
    with ClockWatch(history, server, every=0.005):
        server.wait_for_reads(3)
        server.ahead_ns -= 500_000_000  # leases lapse later than the history says: safe
        server.wait_for_reads(3)
        server.ahead_ns += 500_000_000 + NOISE_NS // 2
        server.wait_for_reads(3)
    assert clock_operation(history)["step_ns"] == 0


def test_without_a_client_it_reads_this_machine_s_wall_clock() -> None:
    history = History()
    watch = ClockWatch(history, every=0.005)
    before = time.time_ns() - time.monotonic_ns()
    with watch:
        time.sleep(0.05)
    # the baseline is this machine's wall clock against its monotonic clock
    assert watch._baseline is not None and abs(watch._baseline - before) < 50_000_000
    assert isinstance(clock_operation(history)["step_ns"], int)
