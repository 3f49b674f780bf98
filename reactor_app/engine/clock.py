"""The engine's clock: how the synchronous path sleeps between retries.

Tests replace it with ``use_clock(FakeClock())`` to check backoff delays without sleeping. It is
never used for coordination, whose time always comes from Redis ``TIME``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar


class SystemClock:
    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    def monotonic(self) -> float:
        return time.monotonic()


class FakeClock:
    """Records requested sleeps and advances instantly."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += max(seconds, 0.0)

    def monotonic(self) -> float:
        return self.now


Clock = SystemClock | FakeClock

_SYSTEM_CLOCK = SystemClock()
_current: ContextVar[Clock | None] = ContextVar("reactor_clock", default=None)


def current_clock() -> Clock:
    return _current.get() or _SYSTEM_CLOCK


@contextlib.contextmanager
def use_clock(clock: Clock) -> Iterator[Clock]:
    token = _current.set(clock)
    try:
        yield clock
    finally:
        _current.reset(token)
