"""Retention: ``manage.py reactor_purge``, ``REACTOR_RETENTION`` and the ``purge`` task delete
finished execution trees with their step runs and events, and nothing else."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from reactor_app.models import CoordinationEvent, Execution, StepRun
from reactor_app.status import CoordinationEventKind, ExecutionStatus, StepRunStatus
from reactor_app.tasks import beat_schedule, purge

pytestmark = pytest.mark.django_db


def _tree(
    age: timedelta, *, status: str = ExecutionStatus.SUCCEEDED, child_status: str | None = None
) -> Execution:
    finished = timezone.now() - age
    root = Execution.objects.start(
        reactor="shop.PaymentReactor",
        inputs={},
        status=status,
        finished_at=finished if status in ("succeeded", "failed", "halted") else None,
    )
    StepRun.objects.create(
        execution=root, step="charge", status=StepRunStatus.SUCCEEDED, started_at=finished
    )
    CoordinationEvent.objects.create(
        execution=root,
        primitive="lock",
        key="acct:1",
        kind=CoordinationEventKind.ACQUIRED,
        at=finished,
    )
    if child_status is not None:
        Execution.objects.start(
            reactor="shop.ChildReactor",
            inputs={},
            parent=root,
            root_id=root.pk,
            status=child_status,
        )
    return root


def test_purge_older_than_deletes_old_finished_trees_only() -> None:
    old = _tree(timedelta(days=40))
    recent = _tree(timedelta(hours=1))
    running = _tree(timedelta(days=40), status=ExecutionStatus.RUNNING)
    old_with_live_child = _tree(timedelta(days=40), child_status=ExecutionStatus.PARKED)
    lonely = CoordinationEvent.objects.create(
        primitive="lock",
        key="k",
        kind=CoordinationEventKind.FORCED_RELEASE,
        at=timezone.now() - timedelta(days=40),
    )

    out = StringIO()
    call_command("reactor_purge", "--older-than", "30d", "--dry-run", stdout=out)
    assert (
        "would delete 1 execution(s), 1 step run(s) and 2 coordination event(s)" in out.getvalue()
    )
    assert Execution.objects.filter(pk=old.pk).exists()

    call_command("reactor_purge", "--older-than", "30d", stdout=out)
    assert "deleted 1 execution(s)" in out.getvalue()
    assert not Execution.objects.filter(pk=old.pk).exists()
    assert not StepRun.objects.filter(execution_id=old.pk).exists()
    assert not CoordinationEvent.objects.filter(pk=lonely.pk).exists()
    assert not CoordinationEvent.objects.filter(execution_id=old.pk).exists()
    kept = {recent.pk, running.pk, old_with_live_child.pk}
    assert kept <= set(Execution.objects.values_list("pk", flat=True))


def test_the_periodic_task_applies_the_retention_setting(settings: Any) -> None:
    old = _tree(timedelta(hours=3))
    settings.REACTOR_RETENTION = None
    assert purge()["executions"] == 0
    settings.REACTOR_RETENTION = timedelta(hours=2)
    assert purge()["executions"] == 1
    assert not Execution.objects.filter(pk=old.pk).exists()
    assert set(beat_schedule()) == {"reactor-sweep", "reactor-purge"}
    assert beat_schedule()["reactor-purge"]["task"] == "reactor_app.purge"


def test_a_bad_age_is_a_command_error() -> None:
    with pytest.raises(CommandError, match="not an age"):
        call_command("reactor_purge", "--older-than", "soon")
