"""Datetimes as the project keeps them, whichever way its ``USE_TZ`` is set.

Django keeps two conventions, and a reusable app must follow the project's: with ``USE_TZ =
True`` every datetime is aware (UTC in the database, the current time zone on screen); with
``USE_TZ = False`` every datetime is naive, in local time (``TIME_ZONE``, which Django also
makes the process's time zone), and an aware one cannot be stored, compared with
``timezone.now()`` or turned to local time by ``timezone.localtime``. The coordination scripts
count time in epoch seconds (Redis ``TIME``), and callers hand in datetimes of either kind, so
each crossing goes through here:

* ``from_epoch`` — a moment the scripts or a stored snapshot give in epoch seconds;
* ``on_screen`` — a stored moment in the time an operator reads (the admin, the timeline);
* ``given`` — a caller's datetime (``run_after``) in the project's kind, or an
  ``InputValidationError`` that says which kind is wanted.

docs/operations.md, "Time zones", says the same for users.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.utils import timezone

from reactor_app.exceptions import InputValidationError


def from_epoch(seconds: float) -> datetime:
    """``seconds`` since the epoch: aware UTC with ``USE_TZ``, naive local time without."""
    if settings.USE_TZ:
        return datetime.fromtimestamp(float(seconds), tz=UTC)
    return datetime.fromtimestamp(float(seconds))


def on_screen(moment: datetime) -> datetime:
    """``moment`` in the current time zone, to be shown. A naive one is local time already (a
    project without ``USE_TZ`` stores and reads local time), so it is shown as it is."""
    if timezone.is_naive(moment):
        return moment
    return timezone.localtime(moment)


def given(value: Any, *, name: str, reactor: str | None = None) -> datetime:
    """A caller's ``name`` (a datetime) in the project's kind.

    With ``USE_TZ``, an aware datetime, as given; a naive one is refused — which instant it
    names depends on a time zone the caller did not say (Django's task API refuses it too).
    Without ``USE_TZ``, a naive one is local time, as given; an aware one is turned into local
    time (the same instant), since the project's clock and columns are naive.
    """
    if not isinstance(value, datetime):
        raise InputValidationError(
            f"{name} must be a datetime, not {type(value).__name__}",
            reactor=reactor,
            field_errors={name: "not a datetime"},
        )
    if settings.USE_TZ:
        if timezone.is_naive(value):
            raise InputValidationError(
                f"{name} must be an aware datetime (USE_TZ is True): give it a tzinfo, "
                "e.g. timezone.now() + timedelta(...)",
                reactor=reactor,
                field_errors={name: "naive datetime"},
            )
        return value
    if timezone.is_naive(value):
        return value
    try:
        return timezone.make_naive(value)
    except (OverflowError, ValueError) as exc:  # an instant past year 1 or 9999, locally
        raise InputValidationError(
            f"{name} {value.isoformat()} has no local time in {settings.TIME_ZONE}: {exc}",
            reactor=reactor,
            field_errors={name: "out of range"},
        ) from exc
