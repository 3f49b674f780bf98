"""A delivery's claim reads its execution's cancel flag in the same round trip.

The claim's ``SET NX`` and the flag's ``GET`` go as one pipeline (``ExecutionClaim.acquire``
with ``read_with``), and the start of the pass uses that read (``cancel_flag.note_read``)
instead of reading again. Real Redis, the test database, deliveries run in this process.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from reactor_app import Reactor, Step, Success, from_input, step
from reactor_app.coordination.redis import get_client
from reactor_app.engine.cancel_flag import flag_keys, request_cancel
from reactor_app.engine.claim import ExecutionClaim
from reactor_app.engine.dispatch import deliver
from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus
from tests.worker.reactors import record, records

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


class Recorded(Step):
    inputs = ("n",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        record("round-trip-body", n=args["n"])
        return Success(args["n"])


class OneStep(Reactor):
    inputs = ("n",)

    only = step(Recorded, n=from_input("n"))


def text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def test_the_claim_reads_the_keys_it_is_given_and_keeps_its_token() -> None:
    execution_id = str(uuid.uuid4())
    client = get_client()
    flag = flag_keys(execution_id)[0]
    client.set(flag, '{"reason": "r"}', ex=30)
    try:
        claim = ExecutionClaim(execution_id, "owner-a")
        assert claim.acquire(read_with=(flag,))
        assert claim.read is not None and [text(v) for v in claim.read] == ['{"reason": "r"}']
        assert text(client.get(claim.name)) == "owner-a"
        # taken: another delivery neither gets it nor a read
        other = ExecutionClaim(execution_id, "owner-b")
        assert not other.acquire(read_with=(flag,))
        assert other.read is None
        # the token the pipeline set is the one the release checks
        claim.release()
        assert client.get(claim.name) is None
        assert other.acquire(read_with=(flag,)) and other.read is not None
        other.release()
    finally:
        client.delete(flag)


def test_a_cancel_raised_before_the_delivery_is_seen_at_the_start_of_its_pass() -> None:
    execution = OneStep.run_async(n=1)
    request_cancel(execution.id, "stop before it starts", "tester")
    outcome = deliver(str(execution.id), start="only")
    assert outcome["status"] == ExecutionStatus.CANCELLED, outcome
    assert records("round-trip-body") == []
    assert Execution.objects.get(pk=execution.pk).status == ExecutionStatus.CANCELLED


def test_a_delivery_without_a_cancel_runs_its_steps() -> None:
    execution = OneStep.run_async(n=2)
    outcome = deliver(str(execution.id), start="only")
    assert outcome["status"] == ExecutionStatus.SUCCEEDED, outcome
    assert [r["n"] for r in records("round-trip-body")] == [2]
