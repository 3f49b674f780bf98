"""Celery tasks: thin shells around ``engine.delivery`` and ``engine.sweeper`` (docs/design.md).

Payloads carry identities only — an execution id — and the execution is committed before its
task is sent. ``acks_late`` + ``reject_on_worker_lost``: a task whose worker dies is
redelivered, and the execution claim makes a duplicate delivery harmless. Contention never
goes through Celery's ``retry`` (it would spend ``max_retries``): a parked execution is
re-sent with ``apply_async(countdown=...)``.

``sweep`` (re-enqueue executions whose worker vanished or whose send failed, renew the holds
parked executions keep) runs without any setup: every worker process starts a timer
(``engine.sweeper``: on Celery's ``worker_process_init`` in a prefork child or a solo worker,
on ``worker_ready`` in a worker whose pool runs tasks in its own process) and one sweep per
``REACTOR_SWEEP_INTERVAL`` runs across the fleet. ``purge`` (delete finished executions older
than ``REACTOR_RETENTION``) is meant to run periodically; add it (and ``sweep``, if you set
``REACTOR_SWEEP_INTERVAL = 0``) to your beat schedule::

    app.conf.beat_schedule = {**app.conf.beat_schedule, **reactor_app.tasks.beat_schedule()}
"""

from __future__ import annotations

from typing import Any

from celery import shared_task
from celery.signals import worker_process_init, worker_ready


@worker_process_init.connect
def _start_worker_sweeps(**_: Any) -> None:
    """Each worker process keeps a sweep timer (see ``engine.sweeper``)."""
    # deferred: this module loads before the apps do (settings and Celery config call
    # beat_schedule()), and the engine imports the models
    from reactor_app.engine.sweeper import start_worker_sweeps

    start_worker_sweeps()


@worker_ready.connect
def _start_sweeps_where_tasks_run_in_the_worker(sender: Any = None, **_: Any) -> None:
    """A pool that runs tasks in the worker's own process — threads, gevent, eventlet —
    sends no ``worker_process_init`` (only prefork, in each child, and solo do): there the
    worker process keeps the timer. Without it such a worker never swept, and executions whose
    delivery vanished, or parked ones whose kept holds needed renewing, waited for a sweep
    from beat or cron that the docs say is not needed. A prefork parent runs no task: its
    children have their own timers."""
    from celery.concurrency.prefork import TaskPool as PreforkPool

    if isinstance(getattr(sender, "pool", None), PreforkPool):
        return
    _start_worker_sweeps()  # a solo worker's started already: once per process


def _options(queue: str | None) -> dict[str, Any]:
    return {"options": {"queue": queue}} if queue else {}


def sweep_schedule(*, queue: str | None = None, every: float = 60.0) -> dict[str, Any]:
    """A beat entry running ``sweep`` every ``every`` seconds.

    Beat sends to Celery's default queue unless told otherwise; pass ``queue`` when your
    workers consume ``REACTOR_CELERY_QUEUE`` with ``-Q`` (settings cannot read the conf object
    while they load, so the queue is passed in).
    """
    return {"task": "reactor_app.sweep", "schedule": every, **_options(queue)}


def purge_schedule(*, queue: str | None = None, every: float = 3600.0) -> dict[str, Any]:
    """A beat entry running ``purge`` (retention, ``REACTOR_RETENTION``) every ``every`` s."""
    return {"task": "reactor_app.purge", "schedule": every, **_options(queue)}


def beat_schedule(
    *, queue: str | None = None, sweep_every: float = 60.0, purge_every: float = 3600.0
) -> dict[str, dict[str, Any]]:
    """Both periodic tasks, as a ``beat_schedule`` fragment."""
    return {
        "reactor-sweep": sweep_schedule(queue=queue, every=sweep_every),
        "reactor-purge": purge_schedule(queue=queue, every=purge_every),
    }


#: a beat entry for ``sweep`` every 60 seconds on Celery's default queue
SWEEP_SCHEDULE: dict[str, Any] = sweep_schedule()


@shared_task(
    name="reactor_app.run_execution",
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    # The execution row is the result (``Execution.wait()``, the admin, the API): storing the
    # delivery's summary in a result backend too cost every delivery that backend's round
    # trips and a synchronous commit, for a value nothing reads (docs/operations.md, "Celery
    # workers", says how to store it anyway).
    ignore_result=True,
)
def run_execution(self: Any, execution_id: str, requeue_token: str | None = None) -> dict[str, Any]:
    """Run (or continue) one execution on this worker. ``requeue_token`` names the park a
    countdown requeue belongs to (see ``engine.delivery.deliver``)."""
    # deferred: this module loads before the apps do (settings and Celery config call
    # beat_schedule()), and the engine imports the models
    from reactor_app.engine import countdowns
    from reactor_app.engine.delivery import deliver
    from reactor_app.engine.enqueueing import OUTAGES_HEADER, START_HEADER
    from reactor_app.engine.time_slice import task_limits, time_slice

    # started first: Celery's time limit counts from the task's start
    clock = time_slice(*task_limits(self))

    # a new execution's first step, and the outages met before a claim, in message headers
    # rather than arguments: a worker of an earlier version ignores a header it does not know
    start = _header(self.request, START_HEADER)
    outages = _header(self.request, OUTAGES_HEADER)
    return deliver(
        execution_id,
        task_id=self.request.id,
        requeue_token=requeue_token,
        start=start if isinstance(start, str) and start else None,
        # a countdown longer than a broker holds comes in hops (engine.countdowns)
        due=countdowns.due_from(_header(self.request, countdowns.DUE_HEADER)),
        priority=countdowns.priority_from(_header(self.request, countdowns.PRIORITY_HEADER)),
        clock=clock,
        outages=outages if isinstance(outages, int) and not isinstance(outages, bool) else 0,
    )


def _header(request: Any, name: str) -> Any:
    """A custom header of the message: a worker's request carries them as attributes, an
    eager ``apply`` in ``.headers``. (Not ``or``: a priority header may be 0.)"""
    value = getattr(request, name, None)
    return value if value is not None else (request.headers or {}).get(name)


@shared_task(name="reactor_app.sweep", acks_late=True)
def sweep() -> dict[str, Any]:
    """Re-enqueue executions whose worker vanished; time out overdue interrupts."""
    # deferred: this module loads before the apps do (settings and Celery config call
    # beat_schedule()), and the engine imports the models
    from reactor_app.engine.sweeper import sweep as sweep_executions

    requeued = sweep_executions()
    return {"requeued": requeued}


@shared_task(name="reactor_app.purge", acks_late=True)
def purge() -> dict[str, Any]:
    """Delete finished executions older than ``REACTOR_RETENTION`` (nothing when it is None)."""
    # deferred: this module loads before the apps do (settings and Celery config call
    # beat_schedule()), and retention imports the models
    from reactor_app.retention import purge_finished

    return purge_finished().as_dict()
