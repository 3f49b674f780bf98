"""Managers and querysets: every query the app makes on its models lives here."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import models
from django.utils import timezone

from reactor_app.status import ExecutionStatus

if TYPE_CHECKING:
    from reactor_app.models import Execution


class ExecutionQuerySet(models.QuerySet):
    def for_reactor(self, reactor_path: str) -> ExecutionQuerySet:
        return self.filter(reactor=reactor_path)

    def roots(self) -> ExecutionQuerySet:
        return self.filter(parent__isnull=True)

    def parked(self) -> ExecutionQuerySet:
        return self.filter(status=ExecutionStatus.PARKED)

    def failed(self) -> ExecutionQuerySet:
        return self.filter(status=ExecutionStatus.FAILED)

    def waiting_on_interrupt(self, correlation_id: str) -> ExecutionQuerySet:
        return self.filter(status=ExecutionStatus.INTERRUPTED, correlation_id=correlation_id)

    def abandoned(self, stale_after: float, now: datetime | None = None) -> ExecutionQuerySet:
        """Running or pending executions whose worker has not been heard of for ``stale_after``s."""
        cutoff = (now or timezone.now()) - timedelta(seconds=stale_after)
        return self.filter(
            status__in=[ExecutionStatus.RUNNING, ExecutionStatus.PENDING, ExecutionStatus.PARKED],
            heartbeat_at__lt=cutoff,
            parent__isnull=True,
        )

    def search_key(self, key: str) -> ExecutionQuerySet:
        """Executions that contended on, or recorded coordination events for, ``key``."""
        return self.filter(
            models.Q(coordination_events__key=key) | models.Q(contention__key=key)
        ).distinct()


class ExecutionManager(models.Manager.from_queryset(ExecutionQuerySet)):  # type: ignore[misc]
    def start(self, *, reactor: str, inputs: dict[str, Any], **fields: Any) -> Execution:
        """Create the row of a new execution (a root unless ``parent`` is given)."""
        execution: Execution = self.model(reactor=reactor, inputs=inputs, **fields)
        if execution.parent_id is None:
            execution.root_id = execution.id
        execution.save(force_insert=True)
        return execution


class StepRunQuerySet(models.QuerySet):
    def for_execution(self, execution_id: Any) -> StepRunQuerySet:
        return self.filter(execution_id=execution_id).order_by("started_at", "id")

    def of_kind(self, kind: str) -> StepRunQuerySet:
        return self.filter(kind=kind)


class ContentionStateQuerySet(models.QuerySet):
    def active(self) -> ContentionStateQuerySet:
        return self.filter(execution__status=ExecutionStatus.PARKED).select_related("execution")

    def for_key(self, key: str) -> ContentionStateQuerySet:
        return self.filter(key=key)


class CoordinationEventQuerySet(models.QuerySet):
    def for_key(self, key: str) -> CoordinationEventQuerySet:
        return self.filter(key=key)

    def between(self, start: datetime | None, end: datetime | None) -> CoordinationEventQuerySet:
        qs = self
        if start is not None:
            qs = qs.filter(at__gte=start)
        if end is not None:
            qs = qs.filter(at__lte=end)
        return qs

    def timeline(self, key: str, start: datetime, end: datetime) -> CoordinationEventQuerySet:
        return self.for_key(key).between(start, end).order_by("at", "id")
