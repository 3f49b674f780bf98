"""How a periodic background job (the worker's sweep timer) reports failing again and again.

Every worker process runs a sweep timer (``engine.sweeper.SweepTimer``) that first takes the
fleet's sweep lease in Redis. While Redis or the database is away, each timer of each process
fails every interval; logging each failure with its traceback wrote a screenful per process
per second or so, which buried what the worker said about its executions (and pushed it out of
any bounded log tail an operator or a test reads).

A streak of failures is therefore logged as: its first failure with the traceback, then one
line at most every ``repeat_every`` seconds (how many failures, for how long, the last error's
message), then one line when the job works again. docs/operations.md, "Recovery", shows the
lines.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

#: seconds between the one-line reports of a streak that goes on
REPEAT_EVERY = 60.0


@dataclass
class FailureStreak:
    """The failures in a row of the job called ``what``, reported as the module says."""

    what: str
    repeat_every: float = REPEAT_EVERY
    clock: Callable[[], float] = time.monotonic
    log: logging.Logger = field(default=logger)
    #: failures since the last success
    failures: int = field(default=0, init=False)
    _since: float = field(default=0.0, init=False, repr=False)
    _reported_at: float = field(default=0.0, init=False, repr=False)

    def failed(self, error: BaseException) -> None:
        """Call from the job's ``except`` block (the traceback is the one being handled)."""
        now = self.clock()
        self.failures += 1
        if self.failures == 1:
            self._since = self._reported_at = now
            self.log.warning(
                "%s failed; it is tried again each interval", self.what, exc_info=error
            )
            return
        if now - self._reported_at < self.repeat_every:
            return
        self._reported_at = now
        self.log.warning(
            "%s still failing: %d times in a row over %.0fs, last: %s",
            self.what,
            self.failures,
            now - self._since,
            _one_line(error),
        )

    def succeeded(self) -> None:
        """Call after each run that did not raise: ends a streak, saying so."""
        if not self.failures:
            return
        self.log.info(
            "%s works again after %d failures over %.0fs",
            self.what,
            self.failures,
            self.clock() - self._since,
        )
        self.failures = 0


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
