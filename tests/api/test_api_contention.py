"""End to end: a worker-mode run refused by a real hold parks, and the API and the admin say so.

The holder is a real execution waiting inside its ``charge`` step (thread, real Redis); the
waiter is delivered as a Celery worker would deliver it (``dispatch.deliver`` in this process).
Only the broker hand-off is replaced — ``dispatch.enqueue`` records what would be sent — so
no stray task is left in the suite's broker; parking, the ContentionState row, the blocker
snapshot, the events and the wake-up on release are the engine's own.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from reactor_app.engine import delivery as dispatch
from reactor_app.engine import enqueueing
from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus
from tests.api.holding import GATES, Gate, PaymentReactor, running

API = "/api/reactor"


@pytest.mark.django_db(transaction=True)
def test_contended_worker_run_parks_and_is_reported_as_parked_not_failed(
    staff_client: Client, monkeypatch: Any
) -> None:
    enqueued: list[tuple[str, float | None]] = []

    def record_enqueue(execution_id: Any, **options: Any) -> None:
        # what would be sent to the broker: the id and, for a park's requeue, its countdown
        enqueued.append((str(execution_id), options.get("countdown")))

    monkeypatch.setattr(enqueueing, "enqueue", record_enqueue)
    waiter_gate = GATES["e2e-waiter"] = Gate()
    waiter_gate.release.set()  # once admitted, the waiter's body finishes at once
    try:
        with running(PaymentReactor, "e2e-holder", account_id=21) as holder:
            waiter = PaymentReactor.run_async(account_id=21, gate="e2e-waiter")
            assert enqueued == [(str(waiter.pk), None)]
            summary = dispatch.deliver(str(waiter.pk))
            assert summary["outcome"] == "parked", summary
            waiter.refresh_from_db()
            assert waiter.status == ExecutionStatus.PARKED and waiter.error is None

            # API: under contention, with the holder as blocker
            rows = staff_client.get(f"{API}/contention/").json()["results"]
            assert len(rows) == 1
            row = rows[0]
            assert (row["execution"], row["execution_status"]) == (str(waiter.pk), "parked")
            assert (row["step"], row["primitive"], row["key"]) == ("charge", "lock", "acct:21")
            assert row["attempts"] == 1 and row["next_attempt_at"]
            assert row["blocker"]["execution"] == holder.execution_id
            assert row["blocker"]["step"] == "charge"
            assert row["blocker"]["since"] is not None and row["blocker"]["ttl"] > 0

            # API: parked, not failed; the events say "parked"
            failed = staff_client.get(f"{API}/executions/", {"status": "failed"}).json()
            assert failed["count"] == 0
            detail = staff_client.get(f"{API}/executions/{waiter.pk}/").json()
            assert detail["status"] == "parked" and detail["parked"] is True
            kinds = [
                e["kind"]
                for e in staff_client.get(f"{API}/events/", {"execution": str(waiter.pk)}).json()[
                    "results"
                ]
            ]
            assert "parked" in kinds

            # admin: the parked list names the blocker and links it
            parked_page = staff_client.get("/admin/reactor_app/parkedexecution/")
            html = parked_page.content.decode()
            holder_url = reverse("admin:reactor_app_execution_change", args=[holder.execution_id])
            assert f'href="{holder_url}"' in html and "acct:21" in html

        # the holder released: the parked waiter was woken (re-enqueued at once)
        assert holder.outcome["result"].ok
        assert (str(waiter.pk), None) in enqueued[1:]
        summary = dispatch.deliver(str(waiter.pk))
        assert summary["outcome"] == "succeeded", summary
        assert Execution.objects.get(pk=waiter.pk).status == ExecutionStatus.SUCCEEDED
        assert staff_client.get(f"{API}/contention/").json()["count"] == 0
        kinds = [
            e["kind"]
            for e in staff_client.get(f"{API}/events/", {"execution": str(waiter.pk)}).json()[
                "results"
            ]
        ]
        assert kinds[:3] == ["released", "acquired", "resumed"]  # newest first
    finally:
        GATES.pop("e2e-waiter", None)
