"""The pytest plugin keeps a module's Celery time limits to that module's messages.

Celery copies ``task_soft_time_limit``/``task_time_limit`` onto a task the first time it binds
it and stamps them on every message the task sends. When that first bind happened while a
test module's ``WORKER_SETTINGS`` (a soft limit of 2 s) were in force, every later module's
messages carried that limit, and a worker given none cut its deliveries by it: run after
``tests/worker/test_time_limits.py`` in one process, ``test_hard_time_limit.py`` saw its body
start four times instead of three. ``refresh_task_time_limits`` (called around each test that
shares a worker's settings) makes the tasks read the limits of the settings in force.
"""

from __future__ import annotations

from typing import Any

import pytest

from reactor_app import Reactor, Step, Success, step
from reactor_app.tasks import run_execution
from reactor_app.testing.pytest_plugin import refresh_task_time_limits
from tests.integration.test_long_countdowns import taken

pytestmark = pytest.mark.django_db(transaction=True)


class Noop(Step):
    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success(None)


class One(Reactor):
    only = step(Noop)


def _limits_of_the_next_message(queue: str) -> Any:
    One.run_async()
    (message,) = taken(queue)
    return tuple(message.get("timelimit") or (None, None))


@pytest.mark.parametrize("limits", [(8, 2), (None, 3), (5, None)])
def test_messages_carry_the_limits_of_the_settings_in_force(
    nobody_queue: str, settings: Any, limits: tuple[int | None, int | None]
) -> None:
    task = run_execution._get_current_object()
    hard, soft = limits
    settings.CELERY_TASK_TIME_LIMIT, settings.CELERY_TASK_SOFT_TIME_LIMIT = hard, soft
    refresh_task_time_limits()
    assert _limits_of_the_next_message(nobody_queue) == limits
    # what an earlier module's bind left: its limits on the class, its options cached
    type(task).time_limit, type(task).soft_time_limit = 8, 2
    task._exec_options = None
    task._get_exec_options()
    del settings.CELERY_TASK_TIME_LIMIT, settings.CELERY_TASK_SOFT_TIME_LIMIT
    refresh_task_time_limits()
    assert _limits_of_the_next_message(nobody_queue) == (None, None)
