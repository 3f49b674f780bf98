"""Chaos tests run real worker processes: the worker tests' fixtures, shared; and
``clock_watch``, a ``ClockWatch`` per recorded history, stopped when the test ends."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from reactor_app.testing.clock_watch import ClockWatch
from reactor_app.testing.history import History
from tests.worker.conftest import celery_worker_settings, fresh_traces, worker

__all__ = ["celery_worker_settings", "clock_watch", "fresh_traces", "worker"]


@pytest.fixture
def clock_watch() -> Iterator[Callable[[History], ClockWatch]]:
    """Start a ``ClockWatch`` of this machine's wall clock recording into a history: the test
    stops it before it reads the history back (``stop``); a test that fails first leaves it to
    this fixture."""
    watches: list[ClockWatch] = []

    def watch(history: History) -> ClockWatch:
        watches.append(ClockWatch(history).start())
        return watches[-1]

    yield watch
    for started in watches:
        started.stop()
