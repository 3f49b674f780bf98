"""``with_rate_limit(..., wait=)``: an in-process caller waits for the window to free (up to
``wait`` seconds) instead of failing at once; without ``wait`` it fails with the exact
``retry_after``."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from reactor_app import Reactor, Step, Success, from_input, step, with_rate_limit
from reactor_app.exceptions import DefinitionError, RateLimitExceeded

pytestmark = pytest.mark.django_db(transaction=True)


def _reactor(wait: float) -> type[Reactor]:
    @with_rate_limit(lambda args: f"api:{args['client']}", limit=1, period=1, wait=wait)
    class CallApi(Step):
        inputs = ("client",)

        def run(self, args: dict[str, Any], context: Any) -> Any:
            return Success(time.monotonic())

    class ApiReactor(Reactor):
        inputs = ("client",)
        call = step(CallApi, client=from_input("client"))
        returns = "call"

    return ApiReactor


def test_a_caller_waits_for_the_window_to_free() -> None:
    reactor = _reactor(wait=5)
    client = uuid.uuid4().hex
    # The first admission lies after ``asked``; its body's own time could lie any stall later
    # (a stall there would shorten the gap this test measures, not lengthen it).
    asked = time.monotonic()
    first = reactor.run(client=client)
    began = time.monotonic()
    second = reactor.run(client=client)
    assert first.ok and second.ok, second.error
    # admitted only once the 1 s window had room again, and well before the 5 s bound
    assert second.value - asked >= 0.9
    assert time.monotonic() - began < 4.5


def test_without_wait_the_refusal_is_immediate_with_retry_after() -> None:
    reactor = _reactor(wait=0)
    client = uuid.uuid4().hex
    assert reactor.run(client=client).ok
    began = time.monotonic()
    refused = reactor.run(client=client)
    assert time.monotonic() - began < 0.9
    assert isinstance(refused.error, RateLimitExceeded)
    assert 0 < refused.error.retry_after <= 1.0


def test_wait_must_be_a_number_of_seconds() -> None:
    with pytest.raises(DefinitionError, match="wait"):
        with_rate_limit(lambda args: "k", limit=1, period="second", wait=-1)
