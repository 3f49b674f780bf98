"""Helpers of the worker tests: polling, overlap detection, broker queue length."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import pytest

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T], timeout: float, interval: float = 0.05, message: str = ""
) -> T:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(message or f"condition not met within {timeout}s")
        time.sleep(interval)


def overlapping(intervals: Iterable[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Pairs of recorded ``{start, end}`` intervals that overlap (touching ends do not)."""
    ordered = sorted(intervals, key=lambda i: i["start"])
    found = []
    for index, current in enumerate(ordered):
        for other in ordered[index + 1 :]:
            if other["start"] >= current["end"]:
                break
            found.append((current, other))
    return found


def queue_length(queue: str) -> int:
    """Messages waiting in ``queue`` on the Celery broker (any kombu transport: a passive
    declare answers the count on Redis and on RabbitMQ alike)."""
    from amqp.exceptions import ChannelError

    from demo_project.celery import app

    with app.connection_for_write() as connection:
        try:
            declared = connection.default_channel.queue_declare(queue, passive=True)
        except ChannelError as exc:
            if "NOT_FOUND" in str(exc):  # never declared: nothing in it
                return 0
            raise
        return int(declared.message_count)


def finished(result: Any, timeout: float = 60) -> Any:
    """A ``django.tasks`` result refreshed until it is finished (the task API's own
    ``refresh``)."""

    def done() -> bool:
        result.refresh()
        return bool(result.is_finished)

    wait_until(done, timeout, message=f"task {result.id} did not finish: {result.status}")
    return result
