"""Parks do not give back failure retries: the attempt count survives a park.

Deliveries run in this process (``deliver`` is the task body); what they enqueue goes to a
queue nobody reads, so the test steps through the deliveries itself.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from reactor_app import Reactor, Retries, Step, Success, from_input, step, with_rate_limit
from reactor_app.engine.dispatch import deliver

pytestmark = pytest.mark.django_db(transaction=True)

ATTEMPTS: list[int] = []


# One admission per two seconds: attempt 2, right after attempt 1, is refused and parks (a
# window of two leaves room for a stalled machine between the two attempts).
@with_rate_limit(lambda args: f"budget:{args['key']}", limit=1, period=2)
class Flaky(Step):
    inputs = ("key",)
    retries = Retries(max_attempts=2, backoff="fixed", base_delay=0)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        ATTEMPTS.append(context.attempt)
        if context.attempt == 1:
            raise RuntimeError("first attempt fails")
        return Success("second attempt")


class BudgetReactor(Reactor):
    inputs = ("key",)
    flaky = step(Flaky, key=from_input("key"))


@pytest.fixture
def in_process(settings: Any) -> Iterator[None]:
    settings.REACTOR_CELERY_QUEUE = f"reactor-nobody-{uuid.uuid4().hex[:8]}"
    settings.REACTOR_CONTENTION_BACKOFF = [0.01, 0.02]
    settings.REACTOR_WORKER_WAIT = 0  # the park itself is under test
    ATTEMPTS.clear()
    yield


def test_a_park_between_attempts_keeps_the_attempt_count(in_process: None) -> None:
    execution = BudgetReactor.run_async(key=1)
    assert deliver(str(execution.id))["outcome"] == "parked"  # attempt 1 failed, 2 parked
    time.sleep(2.1)  # the window frees
    assert deliver(str(execution.id))["outcome"] == "succeeded"
    # The second delivery ran attempt 2, not a fresh attempt 1: the budget was not reset.
    assert ATTEMPTS == [1, 2]
    execution.refresh_from_db()
    assert execution.result == {"flaky": "second attempt"}
