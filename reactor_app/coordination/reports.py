"""What the primitives' operator reports share (``Primitive.inspect``): times as datetimes."""

from __future__ import annotations

from datetime import datetime

from reactor_app.datetimes import from_epoch


def to_datetime(epoch_seconds: float | None) -> datetime | None:
    """A datetime of epoch seconds, of the project's kind (``datetimes.from_epoch``: aware
    UTC with ``USE_TZ``, naive local time without); None stays None."""
    if epoch_seconds is None:
        return None
    return from_epoch(float(epoch_seconds))
