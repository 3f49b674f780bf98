"""Retention: deleting finished executions, their step runs and their coordination events.

Executions, step runs and events are history; without a bound they grow forever. ``REACTOR_
RETENTION`` (seconds or a ``timedelta``; default 30 days, ``None`` = keep everything) is how long
a finished execution tree is kept. The ``reactor_app.purge`` task applies it periodically and
``manage.py reactor_purge --older-than`` does it by hand.

A tree is deleted whole, and only once every execution in it is terminal (a failed async child
under a parent still running is kept with its parent). Coordination events that belong to no
execution (``Step.call``, operator actions) are deleted by their own age. Deletes run in
batches, each in its own transaction, so a large backlog never holds one long lock.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from django.utils import timezone

from reactor_app import isolation
from reactor_app.conf import reactor_settings
from reactor_app.models import CoordinationEvent, Execution, StepRun

#: root executions deleted per transaction
BATCH_SIZE = 500


@dataclass
class PurgeReport:
    """What a purge deleted (or, for a dry run, would delete)."""

    cutoff: str | None
    executions: int = 0
    step_runs: int = 0
    events: int = 0
    dry_run: bool = False

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def purge_finished(
    older_than: float | None = None,
    *,
    now: datetime | None = None,
    dry_run: bool = False,
    batch_size: int = BATCH_SIZE,
) -> PurgeReport:
    """Delete execution trees that finished more than ``older_than`` seconds ago (default:
    ``REACTOR_RETENTION``; with neither, nothing is deleted)."""
    seconds = older_than if older_than is not None else reactor_settings.RETENTION
    if seconds is None:
        return PurgeReport(cutoff=None, dry_run=dry_run)
    cutoff = (now or timezone.now()) - timedelta(seconds=seconds)
    report = PurgeReport(cutoff=cutoff.isoformat(), dry_run=dry_run)
    roots = Execution.objects.finished_before(cutoff).order_by("finished_at")
    if dry_run:
        trees = Execution.objects.filter(root__in=roots.values("pk"))
        report.executions = trees.count()
        report.step_runs = StepRun.objects.filter(execution__in=trees.values("pk")).count()
        report.events = CoordinationEvent.objects.of_executions(trees.values("pk")).count()
        report.events += CoordinationEvent.objects.unattached_before(cutoff).count()
        return report
    while True:
        batch = list(roots.values_list("pk", flat=True)[:batch_size])
        if not batch:
            break
        with isolation.atomic():
            tree_ids = list(Execution.objects.filter(root__in=batch).values_list("pk", flat=True))
            report.step_runs += StepRun.objects.filter(execution__in=tree_ids).count()
            report.events += CoordinationEvent.objects.of_executions(tree_ids).delete()[0]
            # Children first is not needed: root/parent cascade, and the whole tree goes at once.
            report.executions += len(tree_ids)
            Execution.objects.filter(pk__in=tree_ids).delete()
    report.events += CoordinationEvent.objects.unattached_before(cutoff).delete()[0]
    return report
