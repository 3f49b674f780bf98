"""Prometheus collectors in ``prometheus_client``'s default registry, fed by signals.

Imported only when ``prometheus_client`` is installed (``reactor_app.metrics.install``).
Labels are bounded sets — primitive, reactor path, step name, status — never a coordination
key or an execution id, whose values are unbounded and would blow up the scraper's series.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Histogram

from reactor_app import signals
from reactor_app.metrics import EXECUTION_ENDS, STEP_ENDS, Pending, now
from reactor_app.status import CoordinationEventKind, EngineEvent

Kind = CoordinationEventKind

#: seconds; steps and holds span a few milliseconds to minutes
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)

ADMISSIONS = Counter(
    "reactor_admissions",
    "Coordination claims admitted (a first acquisition, not a re-entry by the same owner)",
    ["primitive"],
)
REFUSALS = Counter(
    "reactor_refusals",
    "Coordination claims refused: the execution parked (worker) or failed (in-process wait "
    "exhausted, or no waiting allowed)",
    ["primitive", "outcome"],
)
PARKS = Counter(
    "reactor_parks",
    "Worker executions parked on contention (requeued, holding nothing of the refused step)",
    ["primitive"],
)
LEASES_LOST = Counter(
    "reactor_leases_lost", "Holds found lost (expired or taken) by their owner", ["primitive"]
)
FORCED_RELEASES = Counter(
    "reactor_forced_releases", "Holds released by an operator or a redelivery", ["primitive"]
)
WAKE_LATENCY = Histogram(
    "reactor_wake_latency_seconds",
    "From a worker park to the delivery that resumed it (wall clock, across processes)",
    ["primitive"],
    buckets=DURATION_BUCKETS,
)
HOLD_DURATION = Histogram(
    "reactor_hold_duration_seconds",
    "From acquisition to release of a lock, semaphore slot or period/ordered reservation, "
    "when both happen in this process",
    ["primitive"],
    buckets=DURATION_BUCKETS,
)
EXECUTIONS = Counter(
    "reactor_executions",
    "Execution runs that ended a delivery, by the status they ended in",
    ["reactor", "status"],
)
STEP_DURATION = Histogram(
    "reactor_step_duration_seconds",
    "One attempt of a step body, by outcome (succeeded, failed, retried)",
    ["reactor", "step", "outcome"],
    buckets=DURATION_BUCKETS,
)


_steps = Pending()
_holds = Pending()

#: (metric, label values) -> the metric's child for them. ``labels()`` validates and locks on
#: every call; the label sets are bounded (module docstring), so each child is looked up once
#: and every event after that costs a dict lookup (two per coordination event on a
#: ``Step.call``'s path: docs/benchmarks.md, "Hot path").
_children: dict[tuple[Any, ...], Any] = {}


def _child(metric: Any, *values: str) -> Any:
    key = (metric, *values)
    child = _children.get(key)
    if child is None:
        child = _children[key] = metric.labels(*values)
    return child


def on_engine_event(sender: Any, kind: str, execution: Any, **payload: Any) -> None:
    if kind == _STEP_STARTED:
        _steps.push((execution.pk, payload.get("step"), payload.get("attempt")), now())
        return
    outcome = STEP_ENDS.get(kind)
    if outcome is not None:
        started = _steps.pop((execution.pk, payload.get("step"), payload.get("attempt")))
        if started is not None:
            _child(STEP_DURATION, execution.reactor, payload.get("step") or "", outcome).observe(
                now() - started
            )
        return
    status = EXECUTION_ENDS.get(kind)
    if status is not None:
        _child(EXECUTIONS, execution.reactor, status).inc()


def on_coordination_event(
    sender: Any, kind: str, primitive: str, key: str, owner: str, detail: dict[str, Any], **_: Any
) -> None:
    if kind == _ACQUIRED:
        _holds.push((owner, primitive, key), now())
        if not detail.get("reentrant"):
            _child(ADMISSIONS, primitive).inc()
    elif kind in _HOLD_ENDS:
        started = _holds.pop((owner, primitive, key))
        if started is not None:
            _child(HOLD_DURATION, primitive).observe(now() - started)
        if kind == Kind.FORCED_RELEASE:
            _child(FORCED_RELEASES, primitive).inc()
    elif kind == Kind.ACQUISITION_FAILED:
        _child(REFUSALS, primitive, "failed").inc()
    elif kind == Kind.PARKED:
        _child(REFUSALS, primitive, "parked").inc()
        _child(PARKS, primitive).inc()
    elif kind == Kind.RESUMED:
        waited = detail.get("parked_for")
        if isinstance(waited, (int, float)) and waited >= 0:
            _child(WAKE_LATENCY, primitive).observe(waited)
    elif kind == Kind.LEASE_LOST:
        _child(LEASES_LOST, primitive).inc()


#: the kinds of nearly every event, as plain text (an enum member looked up on its class, or a
#: tuple of them built, costs more than the comparison: two events per ``Step.call``)
_ACQUIRED: str = Kind.ACQUIRED.value
_HOLD_ENDS = frozenset({Kind.RELEASED.value, Kind.FORCED_RELEASE.value, Kind.RELEASE_FAILED.value})
_STEP_STARTED: str = EngineEvent.STEP_STARTED.value


def connect() -> None:
    signals.engine_event.connect(on_engine_event, dispatch_uid="reactor_app.metrics.prometheus")
    signals.coordination_event.connect(
        on_coordination_event, dispatch_uid="reactor_app.metrics.prometheus"
    )
