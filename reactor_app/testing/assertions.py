"""Assertions on live coordination state, with failure messages that describe what was found.

Each assertion reads Redis through ``coordination_state()`` and raises ``AssertionError``
whose message says what was expected **and the state actually found** — who holds the key,
from which step of which execution, its nesting count, lease and fencing token — so a failing
test explains itself without a debugger::

    AssertionError: expected acct:1 locked by step 'charge', but it is held by step 'refund'
    of execution 3f0c… (owner 3f0c…, count 1, ttl 12.3s, token 4)

On success an assertion returns what it checked (a ``LockState``, a token, a holder...), so a
test can go on from there. ``client=`` / ``prefix=`` read another Redis or key space; by
default the configured ones are used (under the pytest plugin: the test's own key space).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from reactor_app.coordination import lock as lock_module
from reactor_app.coordination import primitives
from reactor_app.coordination import semaphore as semaphore_module
from reactor_app.testing.state import (
    LockState,
    OrderedLockState,
    SemaphoreHolder,
    SemaphoreState,
    coordination_state,
)

__all__ = [
    "assert_held_by_step",
    "assert_locked",
    "assert_not_locked",
    "assert_ordered_lock",
    "assert_period_marked",
    "assert_period_not_marked",
    "assert_rate_limit_count",
    "assert_semaphore_count",
    "assert_token_greater",
    "describe_lock",
    "describe_semaphore_holder",
]


class _Unset:
    """Marks an ``assert_ordered_lock`` field the caller did not ask about (None is a value)."""

    def __repr__(self) -> str:
        return "<unset>"


UNSET: Any = _Unset()


# --------------------------------------------------------------------------------------------
# describing state (the second half of every message)


def _seconds(value: float | None) -> str:
    return "no expiry" if value is None else f"ttl {value:.1f}s"


def _attribution(step: str | None, execution: str | None, owner: str | None) -> str:
    who = f"step {step!r}" if step else "reactor level"
    if execution:
        return f"{who} of execution {execution}" if step else f"at {who} by execution {execution}"
    # Step.call and other holders that are not executions only have an owner id
    return f"{who} for owner {owner}" if step else f"at {who} by owner {owner}"


def describe_lock(state: LockState) -> str:
    """``held by step 'charge' of execution … (owner …, count 1, ttl 12.3s, token 4)`` or
    ``free (last fencing token 4)``."""
    if not state.held:
        if state.last_token is None:
            return "free (no fencing token was ever issued for it)"
        return f"free (last fencing token {state.last_token})"
    where = _attribution(state.step, state.execution, state.owner)
    details = [f"owner {state.owner}"] if state.execution and state.owner != state.execution else []
    details += [f"count {state.count}", _seconds(state.ttl)]
    if state.token is not None:
        details.append(f"token {state.token}")
    return f"held {'by ' if state.step else ''}{where} ({', '.join(details)})"


def describe_semaphore_holder(holder: SemaphoreHolder) -> str:
    """``step 'export' of execution … (count 1, ttl 3.2s)``."""
    where = _attribution(holder.step, holder.execution, holder.owner)
    return f"{where} (count {holder.count}, {_seconds(holder.ttl)})"


def _describe_semaphore(state: SemaphoreState) -> str:
    if not state.holders:
        return "it has none"
    listed = "; ".join(describe_semaphore_holder(h) for h in state.holders)
    return f"it has {state.held}: {listed}"


def _window_text(window: str | float | timedelta) -> str:
    if isinstance(window, str):
        return window
    seconds = window.total_seconds() if isinstance(window, timedelta) else float(window)
    return f"{seconds:g}s"


def _holders_word(count: int) -> str:
    return "holder" if count == 1 else "holders"


# --------------------------------------------------------------------------------------------
# locks


def assert_locked(
    key: str,
    by_step: str | None = None,
    by_execution: Any = None,
    *,
    by_owner: str | None = None,
    client: Any = None,
    prefix: str | None = None,
) -> LockState:
    """``key`` is locked — by ``by_step`` (the step the hold is attributed to), by
    ``by_execution`` (the execution that took it) and by ``by_owner`` (the root execution id
    or ``Step.call`` id that owns it) when given. Returns the ``LockState``."""
    __tracebackhide__ = True
    state = coordination_state(client=client, prefix=prefix).lock(key)
    wanted = []
    if by_step is not None:
        wanted.append(f"by step {by_step!r}")
    if by_execution is not None:
        wanted.append(f"by execution {by_execution}")
    if by_owner is not None:
        wanted.append(f"by owner {by_owner}")
    expectation = f"expected {key} locked" + (f" {' and '.join(wanted)}" if wanted else "")
    if not state.held:
        raise AssertionError(f"{expectation}, but it is {describe_lock(state)}")
    if (
        (by_step is not None and state.step != by_step)
        or (by_execution is not None and state.execution != str(by_execution))
        or (by_owner is not None and state.owner != str(by_owner))
    ):
        raise AssertionError(f"{expectation}, but it is {describe_lock(state)}")
    return state


def assert_not_locked(key: str, *, client: Any = None, prefix: str | None = None) -> LockState:
    """``key`` is free (no execution, step or call holds its lock). Returns the ``LockState``."""
    __tracebackhide__ = True
    state = coordination_state(client=client, prefix=prefix).lock(key)
    if state.held:
        raise AssertionError(f"expected {key} to be free, but it is {describe_lock(state)}")
    return state


def assert_token_greater(
    key: str, than: int, *, client: Any = None, prefix: str | None = None
) -> int:
    """The latest fencing token issued for ``key`` (held or released since) is greater than
    ``than`` — i.e. someone acquired the lock afresh after the holder that had ``than``.
    Returns that token."""
    __tracebackhide__ = True
    state = coordination_state(client=client, prefix=prefix).lock(key)
    token = state.last_token if state.last_token is not None else state.token
    expectation = f"expected a fencing token of {key} greater than {than}"
    if token is None:
        raise AssertionError(
            f"{expectation}, but no token was ever issued for {key} (it is {describe_lock(state)})"
        )
    if token <= than:
        raise AssertionError(
            f"{expectation}, but the latest token is {token} (it is {describe_lock(state)})"
        )
    return token


# --------------------------------------------------------------------------------------------
# semaphores, rate limits, periods


def assert_semaphore_count(
    key: str,
    held: int,
    *,
    limit: int | None = None,
    client: Any = None,
    prefix: str | None = None,
) -> SemaphoreState:
    """Exactly ``held`` owners hold a live lease on the semaphore ``key`` (an owner counts once
    however deeply it nests). Returns the ``SemaphoreState`` (``available`` set when ``limit``
    is given)."""
    __tracebackhide__ = True
    state = coordination_state(client=client, prefix=prefix).semaphore(key, limit)
    if state.held != held:
        raise AssertionError(
            f"expected semaphore {key} to have {held} {_holders_word(held)}, "
            f"but {_describe_semaphore(state)}"
        )
    return state


def assert_rate_limit_count(
    key: str,
    window: str | float | timedelta,
    count: int,
    *,
    strategy: str = "sliding",
    client: Any = None,
    prefix: str | None = None,
) -> int:
    """The rate limit of ``key`` counts exactly ``count`` admissions in its current
    ``window`` (a window the declaration uses: ``"second"``, ``"minute"``, ... or seconds)."""
    __tracebackhide__ = True
    found = coordination_state(client=client, prefix=prefix).rate_limit(
        key, window, strategy=strategy
    )
    if found != count:
        raise AssertionError(
            f"expected {count} admission{'s' if count != 1 else ''} of rate limit {key} in its "
            f"current {_window_text(window)} window, but it counts {found}"
        )
    return found


def assert_period_marked(
    key: str,
    every: str | int,
    *,
    by: Any = None,
    client: Any = None,
    prefix: str | None = None,
) -> str:
    """The current ``every`` bucket of ``key`` is marked (by execution ``by`` when given): the
    work ran successfully in it, so the next run in the bucket is skipped. Returns the marker."""
    __tracebackhide__ = True
    marked_by = coordination_state(client=client, prefix=prefix).period_marked_by(key, every)
    expectation = f"expected the current {every} bucket of {key} to be marked" + (
        f" by {by}" if by is not None else ""
    )
    if marked_by is None:
        raise AssertionError(f"{expectation}, but it is not marked")
    if by is not None and marked_by != str(by):
        raise AssertionError(f"{expectation}, but it is marked by {marked_by}")
    return marked_by


def assert_period_not_marked(
    key: str, every: str | int, *, client: Any = None, prefix: str | None = None
) -> None:
    """The current ``every`` bucket of ``key`` is not marked: the next run will do the work."""
    __tracebackhide__ = True
    marked_by = coordination_state(client=client, prefix=prefix).period_marked_by(key, every)
    if marked_by is not None:
        raise AssertionError(
            f"expected the current {every} bucket of {key} not to be marked, "
            f"but it is marked by {marked_by}"
        )


# --------------------------------------------------------------------------------------------
# ordered locks

_ORDERED_FIELDS = ("next", "last_completed", "head", "in_flight", "first_failed")


def _describe_line(state: OrderedLockState) -> str:
    waiting = ", ".join(str(p.nonce) for p in state.positions) or "none"
    return (
        f"next {state.next}, head {state.head}, in flight {state.in_flight}, "
        f"positions registered: {waiting}"
    )


def assert_ordered_lock(
    key: str,
    *,
    last_completed: int | None = UNSET,
    first_failed: int | None = UNSET,
    in_flight: int | None = UNSET,
    next: int = UNSET,  # the field's own name, shadowing the builtin here only
    head: int | None = UNSET,
    client: Any = None,
    prefix: str | None = None,
) -> OrderedLockState:
    """The line of the ordered lock ``key`` has the given fields (only those given are
    compared; ``None`` is a value: ``first_failed=None`` means "no failure stopped the
    line"). Returns the ``OrderedLockState``."""
    __tracebackhide__ = True
    expected = {
        name: value
        for name, value in zip(
            _ORDERED_FIELDS, (next, last_completed, head, in_flight, first_failed), strict=True
        )
        if value is not UNSET
    }
    if not expected:
        raise TypeError("assert_ordered_lock needs at least one field to compare")
    state = coordination_state(client=client, prefix=prefix).ordered_lock(key)
    found = {name: getattr(state, name) for name in expected}
    if found != expected:
        wanted = ", ".join(f"{name}={value!r}" for name, value in expected.items())
        has = ", ".join(f"{name}={value!r}" for name, value in found.items())
        raise AssertionError(
            f"expected ordered lock {key} with {wanted}, but it has {has} ({_describe_line(state)})"
        )
    return state


# --------------------------------------------------------------------------------------------
# step attribution


def assert_held_by_step(
    key: str,
    step: str,
    *,
    primitive: str | None = None,
    execution: Any = None,
    client: Any = None,
    prefix: str | None = None,
) -> LockState | SemaphoreHolder:
    """A live hold on ``key`` is attributed to ``step`` (of ``execution`` when given): the
    lock, or a semaphore lease, that the step itself declared — not a reactor-level hold of the
    same key. ``primitive`` (``"lock"`` or ``"semaphore"``) narrows the search. Returns the
    matching ``LockState`` or ``SemaphoreHolder``."""
    __tracebackhide__ = True
    if primitive is not None and not primitives.holds(primitive):
        raise ValueError(f"primitive must be 'lock' or 'semaphore', got {primitive!r}")
    state = coordination_state(client=client, prefix=prefix)
    wanted_execution = str(execution) if execution is not None else None
    found: list[str] = []
    if primitive in (None, lock_module.PRIMITIVE):
        lock = state.lock(key)
        if lock.held:
            if lock.step == step and wanted_execution in (None, lock.execution):
                return lock
            found.append(f"lock {describe_lock(lock)}")
    if primitive in (None, semaphore_module.PRIMITIVE):
        for holder in state.semaphore(key).holders:
            if holder.step == step and wanted_execution in (None, holder.execution):
                return holder
            found.append(f"semaphore lease of {describe_semaphore_holder(holder)}")
    what = primitives.holding(primitive).HOLD_NOUN if primitive else "hold"
    expectation = f"expected a {what} on {key} attributed to step {step!r}" + (
        f" of execution {wanted_execution}" if wanted_execution else ""
    )
    if not found:
        nothing = (
            primitives.holding(primitive).NONE_HELD
            if primitive
            else "nothing holds it (no lock, no live semaphore lease)"
        )
        raise AssertionError(f"{expectation}, but {nothing}")
    raise AssertionError(f"{expectation}, but it is held only by: {'; '.join(found)}")
