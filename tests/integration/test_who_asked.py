"""``by`` of ``Execution.cancel`` and ``Execution.retry`` (who asked) is text or None, refused
with a structured error before anything happens otherwise (``engine.inputs.who_asked``).

Before: ``cancel(by=object())`` raised a raw ``TypeError`` out of the cancel flag's JSON, and
``cancel(by=5)`` was taken; ``retry(by=object())`` kept the object's ``repr`` in the new
execution's state, with a warning in the log. Text the database cannot store (a NUL, a lone
surrogate) is kept readable instead: it is only shown.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from reactor_app import Failure, Reactor, Step, from_input, step
from reactor_app.engine.cancel_flag import cancel_request
from reactor_app.engine.progress import load_state
from reactor_app.exceptions import InputValidationError
from reactor_app.models import CoordinationEvent, Execution
from reactor_app.status import CoordinationEventKind
from reactor_app.storable import storable_text
from tests.integration.echo import Echo

pytestmark = pytest.mark.django_db(transaction=True)


class Refuses(Step):
    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Failure("no")


class Cancellable(Reactor):
    inputs = ("x",)
    echo = step(Echo, x=from_input("x"))


class Failing(Reactor):
    inputs = ("x",)
    echo = step(Echo, x=from_input("x"))
    refuses = step(Refuses)


whoever = st.one_of(
    st.none(),
    st.text(alphabet=st.characters(blacklist_categories=()), max_size=40),
    st.integers(),
    st.binary(max_size=4),
    st.builds(object),
    st.lists(st.text(max_size=3), max_size=2),
)
hypothesis_settings = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@hypothesis_settings
@given(by=whoever)
@example(by=object())
@example(by=5)
@example(by="ops\x00\ud800")
def test_a_cancel_takes_who_asked_as_text_or_refuses_it_first(nobody_queue: str, by: Any) -> None:
    execution = Cancellable.run_async(x=1)
    if by is not None and not isinstance(by, str):
        with pytest.raises(InputValidationError, match="cancel: by must be text") as raised:
            execution.cancel("stop", by=by)
        assert raised.value.field_errors == {"by": "must be a string"}
        assert cancel_request(execution.id) is None  # no flag raised
        assert not CoordinationEvent.objects.filter(
            kind=CoordinationEventKind.CANCELLED, key=str(execution.id)
        ).exists()
        return
    execution.cancel("stop", by=by)
    request = cancel_request(execution.id)
    assert request is not None and request["by"] == (None if by is None else storable_text(by))
    event = CoordinationEvent.objects.get(
        kind=CoordinationEventKind.CANCELLED, key=str(execution.id)
    )
    assert event.detail["by"] == request["by"]


@hypothesis_settings
@given(by=whoever)
@example(by=object())
@example(by="ops\x00")
def test_a_retry_takes_who_asked_as_text_or_refuses_it_first(by: Any) -> None:
    failed = Execution.objects.get(pk=Failing.run(x=1).execution_id)
    retries = Execution.objects.filter(retry_of=failed)
    if by is not None and not isinstance(by, str):
        with pytest.raises(InputValidationError, match="retry: by must be text"):
            failed.retry(by=by)
        assert not retries.exists()
        return
    retried = failed.retry(by=by)
    assert load_state(retried).origin.retry["by"] == ("" if by is None else storable_text(by))
