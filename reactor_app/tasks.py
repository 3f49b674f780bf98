"""Celery tasks: thin shells around ``engine.dispatch`` (DESIGN §5).

Payloads carry identities only — an execution id — and the execution is committed before its
task is sent. ``acks_late`` + ``reject_on_worker_lost``: a task whose worker dies is
redelivered, and the execution claim makes a duplicate delivery harmless. Contention never
goes through Celery's ``retry`` (it would spend ``max_retries``): a parked execution is
re-sent with ``apply_async(countdown=...)``. Return values land in django-celery-results.

``sweep`` runs periodically without any setup: every worker process starts a timer
(``engine.sweeper``, on Celery's ``worker_process_init``) and one sweep per
``REACTOR_SWEEP_INTERVAL`` runs across the fleet. With ``REACTOR_SWEEP_INTERVAL = 0`` add it to
the beat schedule on the queue your workers consume (``REACTOR_CELERY_QUEUE``) instead, e.g.::

    CELERY_BEAT_SCHEDULE = {"reactor-sweep": reactor_app.tasks.sweep_schedule(queue="reactor")}
"""

from __future__ import annotations

from typing import Any

from celery import shared_task
from celery.signals import worker_process_init


@worker_process_init.connect
def _start_worker_sweeps(**_: Any) -> None:
    """Each worker process keeps a sweep timer (see ``engine.sweeper``)."""
    from reactor_app.engine.sweeper import start_worker_sweeps

    start_worker_sweeps()


def sweep_schedule(*, queue: str = "reactor", every: float = 60.0) -> dict[str, Any]:
    """A beat entry running ``sweep`` every ``every`` seconds on ``queue``.

    Beat sends to Celery's default queue unless told otherwise, and workers started with
    ``-Q <REACTOR_CELERY_QUEUE>`` would never see it; settings cannot read the conf object
    while they load, so the queue is passed in.
    """
    return {"task": "reactor_app.sweep", "schedule": every, "options": {"queue": queue}}


#: a beat entry for ``sweep`` every 60 seconds on the default ``"reactor"`` queue
SWEEP_SCHEDULE: dict[str, Any] = sweep_schedule()


@shared_task(
    name="reactor_app.run_execution",
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
)
def run_execution(self: Any, execution_id: str, requeue_token: str | None = None) -> dict[str, Any]:
    """Run (or continue) one execution on this worker. ``requeue_token`` names the park a
    countdown requeue belongs to (see ``engine.dispatch.deliver``)."""
    from reactor_app.engine.dispatch import deliver

    return deliver(execution_id, task_id=self.request.id, requeue_token=requeue_token)


@shared_task(name="reactor_app.sweep", acks_late=True)
def sweep() -> dict[str, Any]:
    """Re-enqueue executions whose worker vanished; time out overdue interrupts."""
    from reactor_app.engine.dispatch import sweep as sweep_executions

    requeued = sweep_executions()
    return {"requeued": requeued}
