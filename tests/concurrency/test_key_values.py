"""Every key a key function may return is either refused before anything is taken or recorded
exactly (``coordination.keys.user_key_problem``).

Before, a key holding a NUL character (or a lone surrogate, which no UTF-8 Redis key can
hold) or longer than the rows' ``key`` column (512) was
admitted, held and released in Redis, and then its coordination events could not be stored:
PostgreSQL refused them ("text fields cannot contain NUL (0x00) bytes", "value too long"),
the writer dropped them ("dropped tracking row"), and the admin's and the API's history of the
hold was gone. Keys are generated here — any text, NULs, braces, percent signs, the highest
code point, lengths around 512 — and each one runs a locked ``Step.call`` against the real
Redis and database, then is looked for in the event rows.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reactor_app import Step, Success, with_lock, with_semaphore
from reactor_app.coordination.keys import LONGEST_USER_KEY
from reactor_app.exceptions import CoordinationKeyError
from reactor_app.models import CoordinationEvent
from reactor_app.storable import text_problem
from reactor_app.write_behind import flush

pytestmark = pytest.mark.django_db(transaction=True)

keys = st.one_of(
    st.text(min_size=1, max_size=40),
    st.text(alphabet=st.sampled_from("a\0{}%\U0010ffff\ud800"), min_size=1, max_size=8),
    st.integers(min_value=LONGEST_USER_KEY - 2, max_value=LONGEST_USER_KEY + 2).map(
        lambda n: "k" * n
    ),
    st.integers(min_value=LONGEST_USER_KEY - 2, max_value=LONGEST_USER_KEY + 2).map(
        lambda n: "é" * n
    ),
).filter(lambda text: text.strip())  # blank keys have their own error


class Holder(Step):
    inputs = ("key",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success(args["key"])


Locked = with_lock(lambda args: args["key"], ttl=5)(
    type("Locked", (Holder,), {"__module__": __name__})
)
Limited = with_semaphore(lambda args: args["key"], limit=2)(
    type("Limited", (Holder,), {"__module__": __name__})
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=keys)
def test_a_key_is_refused_before_anything_is_taken_or_recorded_exactly(key: str) -> None:
    storable = text_problem(key) is None and len(key) <= LONGEST_USER_KEY
    flush()
    events_before = CoordinationEvent.objects.count()
    # this example's own events: Hypothesis may draw one key in several examples, whose
    # events stay in the table (the database is reset per test, not per example)
    last_before = CoordinationEvent.objects.order_by("-id").values_list("id", flat=True).first()
    for unit in (Locked, Limited):
        outcome = unit.call(key=key)
        if not storable:
            assert isinstance(outcome.error, CoordinationKeyError), outcome
            assert outcome.error.primitive in ("lock", "semaphore")
            continue
        assert outcome.ok and outcome.value == key, outcome
    flush()
    if not storable:  # (a query naming the key would be refused by PostgreSQL too)
        assert CoordinationEvent.objects.count() == events_before
        return
    recorded = CoordinationEvent.objects.filter(key=key, id__gt=last_before or 0)
    assert sorted(recorded.values_list("primitive", "kind")) == [
        ("lock", "acquired"),
        ("lock", "released"),
        ("semaphore", "acquired"),
        ("semaphore", "released"),
    ]


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("acct:\0:1", "contains a NUL character"),
        ("k" * (LONGEST_USER_KEY + 1), "513 characters long, more than the 512"),
    ],
    ids=["nul", "513-characters"],
)
def test_regression_a_key_the_database_cannot_store_fails_the_work_with_a_clear_error(
    key: str, says: str
) -> None:
    """These were admitted, and their events then dropped by the writer."""
    outcome = Locked.call(key=key)
    assert isinstance(outcome.error, CoordinationKeyError)
    assert says in outcome.error.message and "the work did not run" in outcome.error.message
