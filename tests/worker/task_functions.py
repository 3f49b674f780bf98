"""``django.tasks`` functions run by the task backend's tests, importable by the workers.

Bodies record what they did into Redis lists under the current ``REACTOR_KEY_PREFIX`` (the
worker tests' ``record``): enter/exit times in ``time.time_ns()`` and the pid that ran them.
"""

from __future__ import annotations

import os
import time
from typing import Any

from django_tasks import task

from reactor_app import with_lock, with_semaphore
from reactor_app.coordination.redis import get_client
from tests.worker.reactors import record, trace_key


@task
def add(x: int, y: int = 2) -> int:
    return x + y


@task
def fails(message: str) -> None:
    raise ValueError(message)


@task
def shaped(*values: Any, **named: Any) -> dict[str, Any]:
    return {"values": list(values), "named": named, "tuple": (1, 2)}


@task(takes_context=True)
def with_context(context: Any, n: int) -> dict[str, Any]:
    return {"id": context.task_result.id, "attempt": context.attempt, "n": n}


@task(priority=10)
def stamped(label: str) -> str:
    record("stamped", label=label, at=time.time_ns())
    return label


@with_lock(lambda args: f"task-acct:{args['account_id']}", ttl=30)
@task
def locked(account_id: int, hold: float) -> int:
    start = time.time_ns()
    time.sleep(hold)
    record("locked", account_id=account_id, pid=os.getpid(), start=start, end=time.time_ns())
    return account_id


@task
@with_semaphore(lambda args: "task-exports", limit=2)
def limited(hold: float) -> None:
    start = time.time_ns()
    time.sleep(hold)
    record("limited", pid=os.getpid(), start=start, end=time.time_ns())


@task
def blocker(name: str) -> None:
    """Occupies a worker process until the test pushes ``release:<name>`` (at most 60 s)."""
    record("blocking", blocker=name)
    get_client().blpop([trace_key(f"release:{name}")], timeout=60)


@task
def ordered(label: str) -> None:
    record("ordered", label=label, at=time.time_ns())
