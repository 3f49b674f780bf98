"""The sweeper's beat entry goes to the queue the workers consume."""

from __future__ import annotations

from django.conf import settings

from reactor_app.tasks import sweep_schedule


def test_sweep_schedule_names_its_queue() -> None:
    entry = sweep_schedule(queue="payments", every=30)
    assert entry == {"task": "reactor_app.sweep", "schedule": 30, "options": {"queue": "payments"}}


def test_the_demo_beat_schedule_targets_the_reactor_queue() -> None:
    entry = settings.CELERY_BEAT_SCHEDULE["reactor-sweep"]
    assert entry["task"] == "reactor_app.sweep"
    assert entry["options"]["queue"] == settings.REACTOR_CELERY_QUEUE


def test_manage_py_check_reports_invalid_settings(settings: object) -> None:
    from django.core.checks import run_checks

    settings.REACTOR_SWEEP_AFTER = "soon"  # type: ignore[attr-defined]
    settings.REACTOR_EXECUTION_CLAIM_TTL = 0  # type: ignore[attr-defined]
    settings.REACTOR_CELERY_QUEUE = ""  # type: ignore[attr-defined]
    errors = {e.obj for e in run_checks() if e.id == "reactor_app.E001"}
    assert errors == {
        "REACTOR_SWEEP_AFTER",
        "REACTOR_EXECUTION_CLAIM_TTL",
        "REACTOR_CELERY_QUEUE",
    }
