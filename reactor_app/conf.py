"""Typed access to the ``REACTOR_*`` Django settings.

Every attribute reads ``django.conf.settings`` on access, so ``override_settings`` in tests and
settings changed at runtime are always honoured; nothing is cached here.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.utils.functional import empty

from reactor_app.exceptions import ConfigurationError

TRACKING_MODES = ("full", "executions")


class ReactorSettings:
    """The ``REACTOR_*`` settings with their defaults and validation."""

    def _get(self, name: str, default: Any) -> Any:
        # Straight to the settings object behind django.conf.settings: the lazy wrapper's own
        # __getattr__ costs a Python frame and, for a setting left at its default, an exception
        # per read — several per admission. Still read on every access, so override_settings
        # (a new settings object) and runtime assignments (made on this one) apply.
        wrapped = django_settings._wrapped  # type: ignore[misc]
        if wrapped is empty:
            return getattr(django_settings, f"REACTOR_{name}", default)
        return getattr(wrapped, f"REACTOR_{name}", default)

    @property
    def REDIS_URL(self) -> str | None:
        """Coordination Redis; ``None`` means the embedded server (``coordination.embedded``)."""
        return self._get("REDIS_URL", None) or None

    @property
    def EMBEDDED_REDIS_DIR(self) -> str | None:
        """Folder holding the embedded server's socket, pidfile and log."""
        return self._get("EMBEDDED_REDIS_DIR", None)

    @property
    def KEY_PREFIX(self) -> str:
        prefix = self._get("KEY_PREFIX", "reactor")
        if not isinstance(prefix, str) or not prefix or "{" in prefix or "}" in prefix:
            raise ConfigurationError(
                "REACTOR_KEY_PREFIX must be a non-empty string without braces", setting="KEY_PREFIX"
            )
        return prefix

    @property
    def RATE_LIMITS(self) -> dict[str, dict[str, Any]]:
        value = self._get("RATE_LIMITS", {})
        if not isinstance(value, dict):
            raise ConfigurationError(
                "REACTOR_RATE_LIMITS must be a dict of name -> {'limit', 'period'} or {'limits'}",
                setting="RATE_LIMITS",
            )
        return value

    @property
    def CONTENTION_CEILING(self) -> int:
        value = self._get("CONTENTION_CEILING", 20)
        if not isinstance(value, int) or value < 1:
            raise ConfigurationError(
                "REACTOR_CONTENTION_CEILING must be a positive integer",
                setting="CONTENTION_CEILING",
            )
        return value

    @property
    def CONTENTION_BACKOFF(self) -> tuple[float, float]:
        value = self._get("CONTENTION_BACKOFF", (1.0, 30.0))
        try:
            base, cap = (float(v) for v in value)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(
                "REACTOR_CONTENTION_BACKOFF must be a (base_seconds, cap_seconds) pair",
                setting="CONTENTION_BACKOFF",
            ) from exc
        if base <= 0 or cap < base:
            raise ConfigurationError(
                "REACTOR_CONTENTION_BACKOFF needs 0 < base <= cap", setting="CONTENTION_BACKOFF"
            )
        return base, cap

    @property
    def CELERY_QUEUE(self) -> str:
        value = self._get("CELERY_QUEUE", "reactor")
        if not isinstance(value, str) or not value:
            raise ConfigurationError(
                "REACTOR_CELERY_QUEUE must be a non-empty queue name", setting="CELERY_QUEUE"
            )
        return value

    @property
    def TRACKING(self) -> str:
        value = self._get("TRACKING", "full")
        if value not in TRACKING_MODES:
            raise ConfigurationError(
                f"REACTOR_TRACKING must be one of {TRACKING_MODES}, got {value!r}",
                setting="TRACKING",
            )
        return str(value)

    @property
    def TRACKING_FLUSH_INTERVAL(self) -> float:
        """Freshness bound (seconds): the longest a step-run row or coordination event waits in
        the write-behind buffer before it is written (docs/operations.md)."""
        value = self._get("TRACKING_FLUSH_INTERVAL", 0.25)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise ConfigurationError(
                "REACTOR_TRACKING_FLUSH_INTERVAL must be a number of seconds > 0",
                setting="TRACKING_FLUSH_INTERVAL",
            )
        return float(value)

    @property
    def TRACKING_BUFFER_SIZE(self) -> int:
        """Size bound: this many buffered tracking rows wake the writer before the freshness
        bound is up (values under 64 act as 64: below that the bound is not even checked)."""
        value = self._get("TRACKING_BUFFER_SIZE", 1000)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigurationError(
                "REACTOR_TRACKING_BUFFER_SIZE must be a positive integer",
                setting="TRACKING_BUFFER_SIZE",
            )
        return value

    @property
    def TRACKING_FLUSH_ON_FINISH(self) -> bool:
        """An in-process run writes its buffered step runs and events when it ends (bulk, O(1)
        statements), so its ``Result``'s readers see its history at once. ``False``: it leaves
        them to the writer thread (within the freshness bound) and waits for none of them.
        Worker deliveries always write them when they end."""
        value = self._get("TRACKING_FLUSH_ON_FINISH", True)
        if not isinstance(value, bool):
            raise ConfigurationError(
                "REACTOR_TRACKING_FLUSH_ON_FINISH must be True or False",
                setting="TRACKING_FLUSH_ON_FINISH",
            )
        return value

    @property
    def API_PERMISSION_CLASSES(self) -> list[str]:
        return list(
            self._get("API_PERMISSION_CLASSES", ["reactor_app.api.permissions.IsStaffUser"])
        )

    @property
    def EXECUTION_CLAIM_TTL(self) -> float:
        """Seconds a silent worker delivery keeps its claim on an execution."""
        value = self._get("EXECUTION_CLAIM_TTL", 30.0)
        if not isinstance(value, (int, float)) or value <= 0:
            raise ConfigurationError(
                "REACTOR_EXECUTION_CLAIM_TTL must be a number of seconds > 0",
                setting="EXECUTION_CLAIM_TTL",
            )
        return float(value)

    @property
    def SWEEP_AFTER(self) -> float:
        """Seconds without a heartbeat after which the sweeper re-enqueues a running execution."""
        value = self._get("SWEEP_AFTER", 120.0)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise ConfigurationError(
                "REACTOR_SWEEP_AFTER must be a number of seconds > 0", setting="SWEEP_AFTER"
            )
        return float(value)


reactor_settings = ReactorSettings()
