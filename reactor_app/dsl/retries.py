"""Retry policies of steps: how many attempts, and how long to wait between them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reactor_app.exceptions import DefinitionError

BACKOFFS = ("exponential", "linear", "fixed")


@dataclass(frozen=True)
class Retries:
    """``max_attempts`` attempts in all; the delay before attempt n+1 follows ``backoff``.

    exponential: ``base_delay * 2**(n-1)``; linear: ``base_delay * n``; fixed: ``base_delay``;
    each capped at ``max_delay`` seconds.
    """

    max_attempts: int = 1
    backoff: str = "exponential"
    base_delay: float = 1.0
    max_delay: float = 300.0

    def __post_init__(self) -> None:
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise DefinitionError(
                f"Retries.max_attempts must be an integer >= 1, got {self.max_attempts!r}",
                option="max_attempts",
            )
        if self.backoff not in BACKOFFS:
            raise DefinitionError(
                f"Retries.backoff must be one of {BACKOFFS}, got {self.backoff!r}",
                option="backoff",
            )
        if not isinstance(self.base_delay, (int, float)) or self.base_delay < 0:
            raise DefinitionError(
                f"Retries.base_delay must be seconds >= 0, got {self.base_delay!r}",
                option="base_delay",
            )

    def delay_after(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        if self.backoff == "exponential":
            delay = self.base_delay * (2 ** (attempt - 1))
        elif self.backoff == "linear":
            delay = self.base_delay * attempt
        else:
            delay = self.base_delay
        return float(min(delay, self.max_delay))


def as_retries(value: Any, owner: str) -> Retries:
    """Accept ``retries = 3`` (three attempts, exponential backoff from 1s) or a ``Retries``."""
    if isinstance(value, Retries):
        return value
    if value is None:
        return Retries()
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return Retries(max_attempts=value)
    raise DefinitionError(
        f"{owner}: retries must be a positive integer (attempts) or Retries(...), got {value!r}",
        owner=owner,
        option="retries",
    )
