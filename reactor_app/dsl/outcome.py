"""Step outcomes: what a step body returns.

``Success(value)`` completes the step; ``Failure(error, retryable=True)`` fails it (retried while
attempts remain); ``Skipped(value=None, reason=None)`` completes it without anything to undo;
``Halt(reason)`` stops the run cleanly without rollback. A body that raises is a ``Failure``.
A body returning anything else is treated as ``Success(that value)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reactor_app.exceptions import FailureReason


@dataclass(frozen=True)
class Success:
    value: Any = None

    ok = True


@dataclass(frozen=True)
class Failure:
    error: Any = None
    retryable: bool = True

    ok = False

    def exception(self) -> BaseException:
        """The error as an exception: itself, or a plain message or value wrapped in a
        ``FailureReason`` (which reports name by its message alone, never by a type)."""
        if isinstance(self.error, BaseException):
            return self.error
        return FailureReason(self.error)


@dataclass(frozen=True)
class Skipped:
    value: Any = None
    reason: str | None = None

    ok = True


@dataclass(frozen=True)
class Halt:
    reason: str | None = None

    ok = True


Outcome = Success | Failure | Skipped | Halt


def as_outcome(returned: Any) -> Outcome:
    """Normalise what a step body returned."""
    if isinstance(returned, (Success, Failure, Skipped, Halt)):
        return returned
    return Success(returned)
