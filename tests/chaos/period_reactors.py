"""The daily digest of the period race (tests/chaos/test_period_race.py), in a module of its
own so that Celery worker processes can import the reactors by their registered path.

Each body records ``execution|entered ns|left ns`` (``time.time_ns()``: one machine clock,
comparable across threads and processes) in a Redis list under the current key prefix.
"""

from __future__ import annotations

import time
from typing import Any

from reactor_app import Reactor, Step, Success, from_input, step, with_period
from reactor_app.conf import reactor_settings
from reactor_app.coordination.redis import get_client

RACERS = 8
#: long enough that every racer reaches admission while the first body still runs
BODY_SECONDS = 0.4
#: on workers the racers are enqueued once the first run holds the bucket; its body lasts
#: long enough for them all to be delivered (and parked) while it runs
WORKER_BODY_SECONDS = 2.0


def trace_key() -> str:
    return f"{reactor_settings.KEY_PREFIX}:test:period-race"


def record_body(execution_id: str | None, seconds: float) -> None:
    entered = time.time_ns()
    time.sleep(seconds)
    get_client().rpush(trace_key(), f"{execution_id}|{entered}|{time.time_ns()}")


def bodies() -> list[tuple[str, int, int]]:
    rows = []
    for raw in get_client().lrange(trace_key(), 0, -1):
        execution, entered, left = raw.split("|")
        rows.append((execution, int(entered), int(left)))
    return rows


class Digest(Step):
    inputs = ("user",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        slow = args["user"].endswith("-workers")
        record_body(context.execution_id, WORKER_BODY_SECONDS if slow else BODY_SECONDS)
        return Success("sent")


@with_period(lambda args: f"digest:{args['user']}", every="day")
class DailyDigest(Digest):
    """The daily digest, declared at step level."""


class StepLevelDigest(Reactor):
    inputs = ("user",)
    digest = step(DailyDigest, user=from_input("user"))


@with_period(lambda inputs: f"digest:{inputs['user']}", every="day")
class ReactorLevelDigest(Reactor):
    inputs = ("user",)
    digest = step(Digest, user=from_input("user"))


REACTORS = {"step": StepLevelDigest, "reactor": ReactorLevelDigest}
