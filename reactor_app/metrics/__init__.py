"""Prometheus metrics and OpenTelemetry spans, fed by the signals of ``reactor_app.signals``.

Both are optional and zero-cost when absent: ``install()`` (called from ``AppConfig.ready``)
looks for ``prometheus_client`` and ``opentelemetry`` with ``importlib.util.find_spec`` — which
imports nothing — and connects its receivers only for what is installed. Without either, no
receiver is connected and nothing here runs on an event. ``REACTOR_METRICS = False`` turns both
off even when installed.

Everything is observed from events, in the process that emits them. A duration whose start and
end are seen by different processes (a hold kept across a park, a step of an execution whose
delivery died) is not observed rather than guessed; the wake latency is the exception, since the
park's wall-clock time travels with the execution's persisted state (``parked_on["at"]``).
See docs/operations.md, "Metrics and tracing", for the names and labels.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
import time
from collections import OrderedDict
from typing import Any

from django.conf import settings as django_settings

from reactor_app.status import EngineEvent

logger = logging.getLogger(__name__)

#: receivers keep their bookkeeping here; a start never matched by an end (a delivery killed
#: mid-step, a hold released by another process) must not grow memory without bound
MAX_PENDING = 10_000

_installed: dict[str, bool] = {"prometheus": False, "opentelemetry": False}
_install_lock = threading.Lock()


def available(module: str) -> bool:
    """True when ``module`` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def install() -> dict[str, bool]:
    """Connect the receivers of whatever is installed, once per process; what is active."""
    if not getattr(django_settings, "REACTOR_METRICS", True):
        return dict(_installed)
    with _install_lock:
        if not _installed["prometheus"] and available("prometheus_client"):
            # deferred: prometheus_client is optional (the [metrics] extra)
            from reactor_app.metrics import prometheus

            prometheus.connect()
            _installed["prometheus"] = True
        if not _installed["opentelemetry"] and available("opentelemetry.trace"):
            # deferred: opentelemetry is optional (the [metrics] extra)
            from reactor_app.metrics import tracing

            tracing.connect()
            _installed["opentelemetry"] = True
    return dict(_installed)


def installed() -> dict[str, bool]:
    """Which of the two integrations this process connected."""
    return dict(_installed)


#: the engine events that end an execution's delivery, and what each is called in a metric label
#: or span attribute (both receivers read these)
EXECUTION_ENDS: dict[str, str] = {
    EngineEvent.EXECUTION_SUCCEEDED: "succeeded",
    EngineEvent.EXECUTION_FAILED: "failed",
    EngineEvent.EXECUTION_HALTED: "halted",
    EngineEvent.EXECUTION_PARKED: "parked",
    EngineEvent.EXECUTION_INTERRUPTED: "interrupted",
    # an operator's cancel ends the delivery too (its span must end, its run be counted)
    EngineEvent.EXECUTION_CANCELLED: "cancelled",
}
#: the engine events that end a step attempt, likewise
STEP_ENDS: dict[str, str] = {
    EngineEvent.STEP_SUCCEEDED: "succeeded",
    EngineEvent.STEP_FAILED: "failed",
    EngineEvent.STEP_RETRIED: "retried",
}


class Pending:
    """Start times (or span objects) waiting for their end event, bounded in size, thread-safe
    (a worker thread pool emits from several threads)."""

    def __init__(self, limit: int = MAX_PENDING) -> None:
        self.limit = limit
        self._items: OrderedDict[Any, list[Any]] = OrderedDict()
        self._lock = threading.Lock()

    def push(self, key: Any, value: Any) -> None:
        with self._lock:
            self._items.setdefault(key, []).append(value)
            self._items.move_to_end(key)
            while len(self._items) > self.limit:
                self._items.popitem(last=False)

    def pop(self, key: Any) -> Any | None:
        """The latest value pushed under ``key`` (re-entrant holds nest), or None."""
        with self._lock:
            stack = self._items.get(key)
            if not stack:
                return None
            value = stack.pop()
            if not stack:
                del self._items[key]
            return value

    def peek(self, key: Any) -> Any | None:
        """The latest value pushed under ``key``, left in place."""
        with self._lock:
            stack = self._items.get(key)
            return stack[-1] if stack else None

    def __len__(self) -> int:
        return len(self._items)


def now() -> float:
    return time.monotonic()
