"""The codec of values that cross a process boundary (``reactor_app.serialization``): exact
round trips for the types it knows, ``TypeError`` naming the place for the others."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from decimal import Decimal
from typing import Any

import pytest

from reactor_app.engine.state import ExecutionState
from reactor_app.serialization import decode, encode, register_type, to_json


def _through_storage(value: Any) -> Any:
    """What a worker reads back: encoded, written as JSON text, parsed, decoded."""
    return decode(json.loads(json.dumps(encode(value))))


def test_known_types_round_trip_exactly() -> None:
    value = {
        "amount": Decimal("10.50"),
        "day": dt.date(2026, 11, 30),
        "at": dt.datetime(2026, 11, 30, 12, 0, 1, 5, tzinfo=dt.UTC),
        "naive": dt.datetime(2026, 1, 2, 3, 4, 5),
        "time": dt.time(9, 30),
        "span": dt.timedelta(days=1, seconds=2, microseconds=3),
        "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "nested": [{"price": Decimal("0.1")}, None, True, 3, 1.5, "text"],
    }
    back = _through_storage(value)
    assert back == value
    assert type(back["amount"]) is Decimal and str(back["amount"]) == "10.50"
    assert type(back["day"]) is dt.date
    assert back["at"].tzinfo is not None


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ({"tags": {"a", "b"}}, "value['tags'] is a builtins.set"),
        ({"when": object()}, "value['when'] is a builtins.object"),
        ([1, b"raw"], "value[1] is a builtins.bytes"),
        ({1: "int key"}, "has the key 1"),
    ],
)
def test_other_values_raise_type_error_naming_their_place(value: Any, fragment: str) -> None:
    with pytest.raises(TypeError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        encode(value)


@pytest.mark.django_db
def test_a_model_instance_is_refused_with_a_hint_to_pass_its_key(django_user_model: Any) -> None:
    user = django_user_model.objects.create_user("codec-user")
    with pytest.raises(TypeError, match="pass its primary key"):
        encode({"user": user})


def test_lenient_mode_stores_repr_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    assert encode({"s": {1}}, strict=False) == {"s": "{1}"}
    assert "cannot be stored" in caplog.text


def test_registered_types_round_trip() -> None:
    class Money:
        def __init__(self, cents: int) -> None:
            self.cents = cents

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Money) and other.cents == self.cents

        __hash__ = None  # type: ignore[assignment]

    register_type(Money, "test-money", encode=lambda m: m.cents, decode=Money)
    assert _through_storage({"price": Money(250)}) == {"price": Money(250)}
    with pytest.raises(ValueError, match="already used"):
        register_type(dict, "test-money", encode=str, decode=str)


def test_the_reserved_tag_key_is_refused() -> None:
    with pytest.raises(TypeError, match="reserved key"):
        encode({"__reactor_type__": "decimal", "value": "1"})


def test_execution_state_results_survive_a_worker_boundary() -> None:
    """Results kept in Execution.context come back as the same values after a park/hand-off."""
    state = ExecutionState(
        results={"charge": {"amount": Decimal("9.99"), "on": dt.date(2026, 1, 1)}}
    )
    restored = ExecutionState.from_json(json.loads(json.dumps(state.to_json())))
    assert restored.results == state.results


def test_display_form_is_still_readable() -> None:
    assert to_json({"amount": Decimal("1.10"), "s": {1}}) == {"amount": "1.10", "s": "{1}"}
