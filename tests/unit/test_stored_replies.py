"""Retry-safe script calls (``coordination.stored_replies``): the stored-reply key lives in the
slot of the call's keys; the retry loop re-sends only after an unknown outcome and only within
its bounds."""

from __future__ import annotations

import pytest
import redis as redis_py
from hypothesis import given
from hypothesis import strategies as st

from reactor_app.coordination import stored_replies
from reactor_app.coordination.keys import hash_slot, key
from reactor_app.coordination.stored_replies import (
    RETRIES,
    NotSent,
    new_request_id,
    reply_key,
    retrying,
    with_request,
)

PRIMITIVES = st.sampled_from(["lock", "semaphore", "rate_limit", "period", "ordered_lock"])


@given(
    primitive=PRIMITIVES,
    user_key=st.text(min_size=1, max_size=40),
    part=st.sampled_from([(), ("fence",), ("waiters",), ("seq",)]),
    prefix=st.text(alphabet="abcxyz:_-0123456789", min_size=1, max_size=12),
)
def test_the_stored_reply_key_hashes_to_the_slot_of_the_first_key(
    primitive: str, user_key: str, part: tuple[str, ...], prefix: str
) -> None:
    first = key(primitive, user_key, *part, prefix=prefix)
    stored = reply_key(first, new_request_id())
    assert hash_slot(stored) == hash_slot(first)
    assert stored.startswith(f"{prefix}:{primitive}:")  # under the prefix its cleanup scans


@given(first=st.text(alphabet="abcdefgh:_-0123456789", min_size=1, max_size=30))
def test_a_first_key_without_a_tag_is_the_tag_of_its_stored_reply(first: str) -> None:
    assert hash_slot(reply_key(first, "r.1")) == hash_slot(first)


def test_request_ids_differ() -> None:
    ids = {new_request_id() for _ in range(1000)}
    assert len(ids) == 1000


def test_a_call_with_no_key_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one key"):
        with_request([], ["x"])


def test_an_unknown_outcome_is_sent_again_up_to_the_retries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stored_replies, "RETRY_PAUSES", (0.0, 0.0, 0.0))
    sends: list[int] = []

    def lost() -> str:
        sends.append(1)
        raise redis_py.exceptions.ConnectionError("reply lost")

    with pytest.raises(redis_py.exceptions.ConnectionError):
        retrying(lost)
    assert len(sends) == RETRIES + 1

    answers = iter([redis_py.exceptions.TimeoutError("slow"), "stored reply"])

    def once_lost() -> str:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert retrying(once_lost) == "stored reply"


def test_a_request_never_sent_and_an_answered_error_are_not_sent_again() -> None:
    sends: list[int] = []

    def refused() -> str:
        sends.append(1)
        raise NotSent(redis_py.exceptions.ConnectionError("connection refused"))

    with pytest.raises(redis_py.exceptions.ConnectionError, match="refused"):
        retrying(refused)

    def answered_error() -> str:
        sends.append(1)
        raise redis_py.exceptions.ResponseError("ERR from the script")

    with pytest.raises(redis_py.exceptions.ResponseError):
        retrying(answered_error)
    assert len(sends) == 2


def test_no_retry_is_sent_past_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stored_replies, "RETRY_WINDOW", 0.0)
    sends: list[int] = []

    def lost() -> str:
        sends.append(1)
        raise redis_py.exceptions.ConnectionError("reply lost")

    with pytest.raises(redis_py.exceptions.ConnectionError):
        retrying(lost)
    assert len(sends) == 1
