"""A task's arguments and return value come back from ``get_result`` as the values the task API
was given and the function returned (``reactor_app.tasks_backend``).

The row keeps them in the codec's form, where a float the database would not give back as
itself (``-0.0``, and from ``1e16`` up, which PostgreSQL's ``jsonb`` returns as an int) is
tagged. ``get_result`` read the row as it is, so a task that returned ``1e16`` reported
``{"__reactor_type__": "float", "value": "1e+16"}`` as its return value and in its arguments.

The deliveries run in this process (``deliver``, the worker task's body); the real-worker tests
of the backend are in ``tests/worker/test_tasks_backend.py``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django_tasks import TaskResultStatus
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from reactor_app.engine.dispatch import deliver
from tests.worker import task_functions as tasks

pytestmark = pytest.mark.django_db(transaction=True)


#: text the database stores (one with a NUL is refused at the call, as
#: tests/integration/test_unstorable_values.py shows)
plain_text = st.text(max_size=5).filter(lambda text: "\0" not in text)
edge_floats = st.sampled_from([-0.0, 0.0, 1e16, -1e16, 2.0**53 + 2, 1e308, 5e-324, 0.1])
json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(10**20), max_value=10**20),
        st.floats(allow_nan=False, allow_infinity=False),
        edge_floats,
        plain_text,
    ),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(plain_text, inner),
    max_leaves=6,
)


def same(left: Any, right: Any) -> bool:
    """Equal as JSON text: -0.0 is not 0.0, a float is not the int of the same value."""
    return json.dumps(left, sort_keys=True) == json.dumps(right, sort_keys=True)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    values=st.lists(json_values, max_size=3),
    named=st.dictionaries(st.sampled_from("abc"), json_values),
)
@example(values=[1e16, -0.0], named={"a": [1e16]})
def test_get_result_gives_the_arguments_and_the_return_value_as_they_were(
    nobody_queue: str, values: list[Any], named: dict[str, Any]
) -> None:
    enqueued = tasks.shaped.enqueue(*values, **named)
    assert same(enqueued.kwargs, {"values": values, "named": named}), enqueued.kwargs
    outcome = deliver(enqueued.id)
    assert outcome["status"] == "succeeded", outcome
    fetched = tasks.shaped.get_result(enqueued.id)
    assert fetched.status == TaskResultStatus.SUCCESSFUL
    assert same(fetched.kwargs, {"values": values, "named": named}), fetched.kwargs
    # what the function returned, JSON-normalised as the task API does (the tuple a list)
    expected = {"values": values, "named": named, "tuple": [1, 2]}
    assert same(fetched.return_value, expected), fetched.return_value
