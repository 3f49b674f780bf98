"""Sweeps run by the workers themselves, so nothing strands when no beat is configured.

``engine.dispatch.sweep`` re-enqueues executions whose delivery vanished (a killed worker, a
message lost with a restarted broker, a requeue that could not be sent during an outage),
renews the holds parked executions keep, and times out interrupts. Deployments used to have to
schedule it with Celery beat; forgetting meant executions parked forever. Now every worker
process starts a ``SweepTimer`` (``reactor_app.tasks`` connects it to Celery's
``worker_process_init``): every ``REACTOR_SWEEP_INTERVAL`` seconds each timer tries to take a
short Redis lease, and the one that wins sweeps — one sweep per interval across the whole
fleet, whatever the number of workers. ``REACTOR_SWEEP_INTERVAL = 0`` turns it off (run the
``reactor_app.sweep`` task from beat, or ``manage.py reactor_sweep`` from cron, instead).

The bound this gives is in docs/operations.md ("Recovery").
"""

from __future__ import annotations

import logging
import os
import socket
import threading

from django.db import close_old_connections, connections

from reactor_app.conf import reactor_settings
from reactor_app.coordination.redis import get_client, key
from reactor_app.engine.dispatch import sweep

logger = logging.getLogger(__name__)


class SweepTimer:
    """A daemon thread sweeping every ``interval`` seconds when it wins the fleet's lease."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="reactor-sweeper", daemon=True)

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
            except Exception:  # Redis or the database away: try again next interval
                logger.warning("worker sweep failed", exc_info=True)
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
        if _timer is None:
            _timer = SweepTimer(interval)
            _timer.start()
        return _timer
