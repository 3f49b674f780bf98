"""What the primitives' operator reports share (``Primitive.inspect``): times as datetimes."""

from __future__ import annotations

from datetime import UTC, datetime


def to_datetime(epoch_seconds: float | None) -> datetime | None:
    """An aware UTC datetime of epoch seconds (None stays None)."""
    if epoch_seconds is None:
        return None
    return datetime.fromtimestamp(float(epoch_seconds), tz=UTC)
