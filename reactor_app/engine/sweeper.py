"""The sweep, and the timers that run it from the workers themselves.

``sweep`` re-enqueues executions whose delivery vanished (a killed worker, a message lost with
a restarted broker, a requeue that could not be sent during an outage): worker executions whose
heartbeat is older than ``REACTOR_SWEEP_AFTER`` and whose claim is free. It also renews the
holds parked executions keep (``renew_kept_holds``), keeps the places in line of executions
queued or parked (``engine.waiting_positions``), completes the heads of ordered lines left by
executions that ended (``engine.stranded_positions``), and times out overdue interrupts
(``engine.interrupt_delivery.time_out_interrupt``), and publishes the operators' live limit
overrides again if Redis lost them (``coordination.live_limits``).

Deployments used to have to schedule it with Celery beat; forgetting meant executions parked
forever. Now every worker process starts a ``SweepTimer`` (``reactor_app.tasks`` connects it to
Celery's ``worker_process_init``): every ``REACTOR_SWEEP_INTERVAL`` seconds each timer tries to
take a short Redis lease, and the one that wins sweeps — one sweep per interval across the
whole fleet, whatever the number of workers. ``REACTOR_SWEEP_INTERVAL = 0`` turns it off (run
the ``reactor_app.sweep`` task from beat, or ``manage.py reactor_sweep`` from cron, instead).

The bound this gives is in docs/operations.md ("Recovery").
"""

from __future__ import annotations

import logging
import socket
import threading
from datetime import datetime, timedelta

from django.db import close_old_connections, connections
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from reactor_app import forks
from reactor_app.conf import reactor_settings
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.keys import key
from reactor_app.coordination.redis import get_client
from reactor_app.engine.claim import ExecutionClaim
from reactor_app.engine.delivery import RUNNABLE
from reactor_app.engine.enqueueing import enqueue
from reactor_app.engine.failure_streak import FailureStreak
from reactor_app.engine.interrupt_delivery import deadline_passed, time_out_interrupt
from reactor_app.engine.priority import stored_message_priority
from reactor_app.engine.state import KEPT_HOLDS, WORKER, ExecutionState, kept_hold
from reactor_app.engine.stranded_positions import complete_stranded_heads
from reactor_app.engine.waiting_positions import keep_waiting_positions
from reactor_app.engine.worker import park_margin
from reactor_app.exceptions import ReactorError
from reactor_app.models import Execution, LimitOverride
from reactor_app.status import ExecutionStatus

logger = logging.getLogger(__name__)


def sweep(now: datetime | None = None) -> list[str]:
    """Re-enqueue worker executions whose delivery vanished; time out overdue interrupts.

    An execution is abandoned when its heartbeat is older than ``REACTOR_SWEEP_AFTER`` and its
    claim is free (a live delivery renews the claim however long its step runs). A parked
    execution is abandoned only once its own requeue is overdue by the same margin. Returns
    the ids enqueued.
    """
    now = now or timezone.now()
    stale = now - timedelta(seconds=reactor_settings.SWEEP_AFTER)
    enqueued: list[str] = []
    candidates = Execution.objects.filter(
        status__in=RUNNABLE, heartbeat_at__lt=stale, **{f"context__{WORKER}": True}
    ).only("id", "status", "heartbeat_at", "context")
    for execution in candidates.iterator():
        if execution.status == ExecutionStatus.PARKED:
            requeue_at = parse_datetime(
                ExecutionState.peek(execution.context).continuation.requeue_at or ""
            )
            if requeue_at is not None and requeue_at > stale:
                continue
        if ExecutionClaim.is_held(execution.id):
            continue
        # compare-and-set on the heartbeat: of two sweepers only one enqueues
        won = Execution.objects.filter(pk=execution.pk, heartbeat_at=execution.heartbeat_at).update(
            heartbeat_at=now
        )
        if won:
            enqueue(execution.id, priority=stored_message_priority(execution.context))
            enqueued.append(str(execution.id))
    renew_kept_holds(now)
    keep_waiting_positions(now)
    complete_stranded_heads()
    interrupted = Execution.objects.filter(status=ExecutionStatus.INTERRUPTED).only(
        "id", "context", "current_step"
    )
    for execution in interrupted.iterator():
        entry = (ExecutionState.peek(execution.context).interrupts or {}).get(
            execution.current_step
        )
        overdue = bool(entry and "payload" not in entry and deadline_passed(entry, now))
        if overdue and time_out_interrupt(execution.id, now):
            enqueued.append(str(execution.id))
    _heal_live_limits()
    return enqueued


def _heal_live_limits() -> None:
    """Publish the operators' limit overrides again if Redis lost them (a restart without
    persistence) or a publish failed: processes would otherwise obey settings again."""
    try:
        if LimitOverride.objects.republish_if_lost():
            logger.warning("sweep published the live limit overrides again (Redis had lost them)")
    except Exception:
        logger.exception("could not check the published live limit overrides")


def renew_kept_holds(now: datetime | None = None) -> int:
    """Lengthen the reactor-level holds parked executions keep, for as long as they stay
    parked: until each is due back (its ``requeue_at``, or now when overdue) plus
    ``park_margin()``. A hold found lost is left to the execution, whose resume then fails
    with ``LeaseLost``. Returns how many holds were renewed."""
    now = now or timezone.now()
    parked = Execution.objects.filter(
        status=ExecutionStatus.PARKED, context__has_key=KEPT_HOLDS
    ).only("id", "root", "context")
    coordinator = Coordinator()
    renewed = 0
    for execution in parked.iterator():
        continuation = ExecutionState.peek(execution.context).continuation
        holds = [h for e in continuation.kept_holds or [] if (h := kept_hold(e)) is not None]
        if not holds:
            continue
        requeue_at = parse_datetime(continuation.requeue_at or "")
        due = max((requeue_at - now).total_seconds(), 0.0) if requeue_at else 0.0
        owner = str(execution.root_id or execution.id)
        try:
            extended = coordinator.extend(holds, owner, lease_ms=int((due + park_margin()) * 1000))
        except ReactorError:
            logger.warning("could not renew the kept holds of %s", execution.id)
            continue
        renewed += len(extended.extended)
    return renewed


class SweepTimer:
    """A daemon thread sweeping every ``interval`` seconds when it wins the fleet's lease."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.pid = forks.pid()
        self.owner = f"{socket.gethostname()}:{self.pid}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="reactor-sweeper", daemon=True)
        # an outage fails every interval of every process: a traceback once, then a line a
        # minute (engine.failure_streak)
        self.streak = FailureStreak("worker sweep")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                if self._won():
                    self.sweep()
            except Exception as error:  # Redis or the database away: try again next interval
                self.streak.failed(error)
            else:
                self.streak.succeeded()
            finally:
                close_old_connections()

    def _won(self) -> bool:
        """One sweep per interval across every worker: a lease a little shorter than it."""
        lease_ms = max(int(self.interval * 900), 1)
        name = key("sweeper", "lease")
        return bool(get_client().set(name, self.owner, nx=True, px=lease_ms))

    def sweep(self) -> list[str]:
        try:
            requeued = sweep()
        finally:
            connections.close_all()
        if requeued:
            logger.info("worker sweep re-enqueued %s", requeued)
        return requeued


_timer: SweepTimer | None = None
_timer_guard = threading.Lock()


def start_worker_sweeps() -> SweepTimer | None:
    """Start this process's timer (once), unless ``REACTOR_SWEEP_INTERVAL`` is 0."""
    global _timer
    interval = reactor_settings.SWEEP_INTERVAL
    if not interval:
        return None
    with _timer_guard:
        # a forked child has its parent's timer object, not its thread: it starts its own
        if _timer is None or _timer.pid != forks.pid():
            _timer = SweepTimer(interval)
            _timer.start()
        return _timer
