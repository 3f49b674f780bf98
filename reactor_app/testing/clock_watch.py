"""A watch on the Redis server's clock while a history is recorded.

A history's times are this machine's ``CLOCK_MONOTONIC`` (``testing.history``), but a Redis
lease lapses on the server's *wall* clock: ``PEXPIRE`` and every ``TIME`` a script reads follow
it. When the wall clock steps forward against the monotonic one, leases lapse early by that
much as the history sees them, and a sliding window forgets its charges early — with no fault
in the code under test. A virtual machine does this when its host pauses it (a snapshot, a
live migration): the monotonic clock skips the pause, the wall clock is set right afterwards.
A soak run on the development VM met one (docs/testing.md, "The server's clock").

``ClockWatch`` samples the server's ``TIME`` against the monotonic clock on a thread for as
long as the ``with`` block runs, and records what it saw in the history as one nemesis
operation, ``clock``, spanning the block, with ``step_ns``: how far the server's clock got
ahead of the monotonic one beyond what the samples' own round trips can explain (0 when it
kept pace). ``linearizability.check`` gives the lease models that much more slack, and says
so in its summary: what the history still proves is stated, not hidden.
"""

from __future__ import annotations

import contextlib
import threading
import time
from types import TracebackType
from typing import Any

from reactor_app.testing.history import CLOCK, Completion, History

#: seconds between two samples of the server's clock
SAMPLE_EVERY = 0.02
#: a step below this is the samples' jitter (a round trip stalled on a busy machine), not a
#: step of the clock: not recorded
NOISE_NS = 2_000_000


class ClockWatch:
    """Samples a server's clock while the block runs; records a ``clock`` nemesis operation
    (``step_ns``) in ``history`` when it ends.

    ``client``: a redis-py client of the server whose leases the history checks (its ``TIME``
    is read). None: this machine's wall clock — the clock of every server running here, read
    without a round trip (and without a connection a forked child could inherit mid-call)."""

    def __init__(
        self, history: History, client: Any = None, *, every: float = SAMPLE_EVERY
    ) -> None:
        self.history = history
        self.client = client
        self.every = every
        #: the largest forward step seen so far (ns), beyond the samples' round trips
        self.step_ns = 0
        self._baseline: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="clock-watch", daemon=True)
        self._fault: Completion | None = None

    def sample(self) -> None:
        """One reading of the server's clock. The server read its clock somewhere between
        ``before`` and ``after``: its lead over the monotonic clock is at least
        ``server - after`` and at most ``server - before``. A step is the least lead of a
        sample beyond the greatest lead of the first one."""
        before = time.monotonic_ns()
        server = self._server_time_ns()
        after = time.monotonic_ns()
        if self._baseline is None:
            self._baseline = server - before
            return
        ahead = (server - after) - self._baseline
        if ahead > self.step_ns:
            self.step_ns = ahead

    def _server_time_ns(self) -> int:
        if self.client is None:
            return time.time_ns()
        seconds, micros = self.client.time()
        return int(seconds) * 1_000_000_000 + int(micros) * 1_000

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.sample()
            except Exception:  # a fault schedule may break the server: the next sample counts
                continue

    def start(self) -> ClockWatch:
        """Take the baseline, open the ``clock`` operation and start sampling."""
        self.sample()  # the baseline, before anything is recorded
        self._fault = self.history.nemesis(CLOCK, what="the server's clock, watched")
        self._thread.start()
        return self

    def stop(self) -> int:
        """Stop sampling and complete the ``clock`` operation with the step seen (ns; 0 when
        within the samples' noise); once — a second call answers the same."""
        if self._fault is not None and not self._fault.done:
            self._stop.set()
            self._thread.join(10)
            # the server may be gone (a schedule stopped it): the samples taken while it ran
            # stand
            with contextlib.suppress(Exception):
                self.sample()
            self._fault.ok(what="the server's clock, watched", step_ns=self.recorded_step_ns)
        return self.recorded_step_ns

    @property
    def recorded_step_ns(self) -> int:
        return self.step_ns if self.step_ns >= NOISE_NS else 0

    def __enter__(self) -> ClockWatch:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
