"""Superseded starts of a debounce burst name the start that runs, whatever order the settles of
the burst's starts commit in (``ExecutionManager.supersede``).

Each start of a burst settles on its own, concurrently: one marks ``A`` superseded by ``F``
while another marks ``F`` superseded by ``C``. Found by the thread test in
``tests/worker/test_debounce.py`` (six simultaneous starts): when the second settle committed
first, ``A`` was left naming ``F``, a start that never runs. Here both commit orders, made
sequential, and every superseded row must name ``C``.
"""

from __future__ import annotations

from datetime import datetime

import pytest
from django.utils import timezone

from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus

pytestmark = pytest.mark.django_db


def _pending(name: str) -> Execution:
    return Execution.objects.start(
        reactor="tests.debounced", inputs={"name": name}, status=ExecutionStatus.PENDING
    )


def _named(*rows: Execution) -> list[str]:
    return [str(Execution.objects.get(pk=row.pk).superseded_by_id) for row in rows]


@pytest.mark.parametrize("first", ["earlier pair", "later pair"])
def test_every_superseded_start_names_the_one_that_runs(first: str) -> None:
    a, f, c = _pending("a"), _pending("f"), _pending("c")
    now: datetime = timezone.now()
    if first == "earlier pair":
        Execution.objects.supersede([a.pk], f.pk, now)
        Execution.objects.supersede([f.pk], c.pk, now)
    else:  # the settle that replaced F committed before the one pointing A at F
        Execution.objects.supersede([f.pk], c.pk, now)
        Execution.objects.supersede([a.pk], f.pk, now)
    assert _named(a, f) == [str(c.pk), str(c.pk)]
    assert Execution.objects.get(pk=c.pk).status == ExecutionStatus.PENDING
