"""The operator verbs refuse text they cannot act on or audit, before changing anything.

``operator.operations`` (force release, ordered skip, ordered reset) takes a key, an owner and
the operator's name. A lone surrogate cannot be sent to Redis, and neither it nor a NUL
character can be stored in the audit event: given one, a verb raises ``ValueError`` naming the
argument, and the hold or the line is as it was, with no audit row — instead of redis-py's
``UnicodeEncodeError``, or a release done and then left unaudited by a failed ``INSERT``.
The cases are generated: any text with one such character at any place, in any argument.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Admitted, Holder, LockClaim
from reactor_app.coordination.state import ordered_state
from reactor_app.models import CoordinationEvent
from reactor_app.operator import operations
from reactor_app.testing import assert_locked, assert_not_locked

pytestmark = pytest.mark.django_db(transaction=True)

#: characters no verb can act on: lone surrogates (no UTF-8 form) and NUL (PostgreSQL text)
UNUSABLE = st.sampled_from(["\x00", "\ud800", "\udfff", "\udc80"])
PLAIN = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))


@st.composite
def spoiled(draw: Any) -> str:
    """Text holding one unusable character at any place."""
    text = draw(PLAIN)
    at = draw(st.integers(min_value=0, max_value=len(text)))
    return text[:at] + draw(UNUSABLE) + text[at:]


VERBS = ("force_release", "ordered_skip", "ordered_reset")


def _line(key: str) -> dict[str, Any]:
    """The ordered line of ``key``, without the positions' heartbeat ages (they grow)."""
    state = asdict(ordered_state(key))
    for position in state["positions"]:
        position.pop("heartbeat_age", None)
    return state


def _call(verb: str, key: str, owner: str | None, by: str) -> Any:
    if verb == "force_release":
        return operations.force_release("lock", key, owner, by=by)
    return getattr(operations, verb)(key, by=by)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    verb=st.sampled_from(VERBS),
    spoilt=st.sampled_from(["key", "owner", "by"]),
    bad=spoiled(),
    suffix=st.integers(min_value=0, max_value=10**9),
)
def test_a_verb_given_text_it_cannot_use_changes_nothing_and_says_which(
    verb: str, spoilt: str, bad: str, suffix: int
) -> None:
    if spoilt == "owner" and verb != "force_release":
        spoilt = "by"  # only force_release takes an owner
    good_key = f"ops-text:{suffix}"
    coordinator = Coordinator()
    # something for the verb to act on: a held lock, and an ordered line with a head
    assert isinstance(coordinator.admit([LockClaim(good_key, ttl=60)], Holder("held")), Admitted)
    coordinator.assign_position(good_key, Holder("first"))
    line_before = _line(good_key)
    events_before = CoordinationEvent.objects.count()
    args = {"key": good_key, "owner": "held", "by": "ops", spoilt: bad}

    with pytest.raises(ValueError, match=rf"^{spoilt} holds .*nothing was changed"):
        _call(verb, args["key"], args["owner"], args["by"])

    assert_locked(good_key, by_owner="held")
    assert _line(good_key) == line_before
    assert CoordinationEvent.objects.count() == events_before


@pytest.mark.parametrize("verb", VERBS)
def test_a_verb_given_plain_text_acts_and_audits(verb: str) -> None:
    """The baseline the property compares with: the same calls with plain text change the
    key and leave one audit row."""
    key = f"ops-text:plain:{verb}"
    coordinator = Coordinator()
    assert isinstance(coordinator.admit([LockClaim(key, ttl=60)], Holder("held")), Admitted)
    coordinator.assign_position(key, Holder("first"))
    line_before = _line(key)

    _call(verb, key, "held", "ops é 🙂")

    audit = CoordinationEvent.objects.get(key=key)
    assert audit.detail["by"] == "ops é 🙂"
    if verb == "force_release":
        assert_not_locked(key)
        assert _line(key) == line_before  # the line is another primitive's
    else:
        assert_locked(key, by_owner="held")
        assert _line(key) != line_before
