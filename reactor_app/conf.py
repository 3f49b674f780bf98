"""Typed access to the ``REACTOR_*`` Django settings.

Values are read from ``django.conf.settings`` once per settings object and then served from a
small cache: the hot path reads a dozen settings per ``Step.call``, and walking Django's
settings chain for each cost more than some of the Redis work (docs/benchmarks.md, "Hot
path"). The cache follows what Django itself supports: ``override_settings`` and pytest-django's
``settings`` fixture (a new settings object, and the ``setting_changed`` signal) are seen at
once. Assigning attributes of ``django.conf.settings`` at runtime — which Django documents as
unsupported — is not; use ``override_settings`` (``.enable()``/``.disable()`` outside tests).
"""

from __future__ import annotations

from typing import Any

from django.conf import Settings
from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.utils.functional import empty

from reactor_app import bounds
from reactor_app.exceptions import ConfigurationError

TRACKING_MODES = ("full", "executions")
#: ``REACTOR_REDIS_URL`` value that opts in to the embedded development server
EMBEDDED = "embedded"


def _read(holder: Any, name: str, default: Any) -> Any:
    """``getattr(holder, name, default)`` without the exception a missing setting costs.

    Follows Django's chain of settings objects by their instance dicts: an
    ``override_settings`` layer (``UserSettingsHolder``: its own values, ``_deleted`` names,
    then ``default_settings`` below it) down to the project's ``Settings``. Anything else is
    read with ``getattr``.
    """
    while True:
        values = getattr(holder, "__dict__", None)
        if values is None:
            return getattr(holder, name, default)
        if name in values:
            return values[name]
        deleted = values.get("_deleted")
        if deleted is not None and name in deleted:
            return default
        below = values.get("default_settings")
        if below is None:
            return default if isinstance(holder, Settings) else getattr(holder, name, default)
        holder = below


#: a setting the project leaves unset (its default applies), in the cache
_UNSET: Any = object()

#: the instance dict of ``django.conf.settings``, where it keeps the settings object it wraps
#: (``_wrapped``; ``override_settings`` swaps it there). Read directly: ``LazyObject`` answers
#: every attribute through a Python-level ``__getattribute__``, and the hot path asks for the
#: settings object a dozen times per ``Step.call``. With ``.get``: while a swap is under way
#: the dict is empty for a moment (Django clears it first), and the wrapper's own answer then
#: is its class default, None — so is this one (a setting read then gets its default).
_lazy_state: dict[str, Any] = object.__getattribute__(django_settings, "__dict__")


class ReactorSettings:
    """The ``REACTOR_*`` settings with their defaults and validation."""

    def __init__(self) -> None:
        #: raw values by name (``_UNSET`` for absent ones), read from ``_cached_for``
        self._cache: dict[str, Any] = {}
        self._cached_for: Any = None
        self._version = 0
        setting_changed.connect(self._changed, dispatch_uid="reactor_app.conf")

    def _changed(self, setting: str = "", **_: Any) -> None:
        if setting.startswith("REACTOR_"):
            self._cache.clear()
            self._version += 1

    def version(self) -> int:
        """A number that changes whenever the settings may have (a new settings object, a
        ``setting_changed``): what is derived from several settings can be kept until then."""
        self._follow(_lazy_state.get("_wrapped"))
        return self._version

    def _follow(self, wrapped: Any) -> None:
        """Start over when ``override_settings`` (or a test) installed another settings object."""
        if self._cached_for is not wrapped:
            self._cache.clear()
            self._cached_for = wrapped
            self._version += 1

    def _get(self, name: str, default: Any) -> Any:
        # Straight to the settings object behind django.conf.settings: the lazy wrapper's own
        # __getattr__ costs a Python frame and, for a setting left at its default, an exception
        # per read. Cached per settings object: override_settings installs a new one.
        wrapped = _lazy_state.get("_wrapped")
        if wrapped is empty:
            return getattr(django_settings, f"REACTOR_{name}", default)
        self._follow(wrapped)
        cache = self._cache
        value = cache.get(name, _UNSET)
        if value is _UNSET and name not in cache:
            value = cache[name] = _read(wrapped, f"REACTOR_{name}", _UNSET)
        return default if value is _UNSET else value

    def _seconds(self, name: str, default: float, *, allow_zero: bool, note: str = "") -> float:
        """A duration setting: a finite number of seconds, > 0 (or >= 0 with ``allow_zero``),
        at most ``bounds.LONGEST_SECONDS``. NaN passed the older ``value <= 0`` checks and an
        infinity overflowed the first ``timedelta`` made of it."""
        value = self._get(name, default)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        # (each comparison is False for NaN)
        if (
            number
            and (value > 0 or (allow_zero and value == 0))
            and value <= bounds.LONGEST_SECONDS
        ):
            return float(value)
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigurationError(
            f"REACTOR_{name} must be a number of seconds {bound} and at most "
            f"{bounds.LONGEST_TEXT}{' ' + note if note else ''}, got {value!r}",
            setting=name,
        )

    def _count(self, name: str, default: int | None, *, minimum: int, note: str = "") -> int:
        """A whole-number setting, at least ``minimum`` (``True`` is not one)."""
        value = self._get(name, default)
        if isinstance(value, int) and not isinstance(value, bool) and value >= minimum:
            return value
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ConfigurationError(
            f"REACTOR_{name} must be {what}{' ' + note if note else ''}, got {value!r}",
            setting=name,
        )

    @property
    def REDIS_URL(self) -> str | None:
        """Coordination Redis URL; ``"embedded"`` opts in to a development server started on
        demand (``coordination.embedded``); ``None`` means not configured."""
        return self._get("REDIS_URL", None) or None

    @property
    def REDIS(self) -> dict[str, Any] | None:
        """Coordination Redis as a dict (cluster, sentinel, TLS options); parsed and validated
        by ``reactor_app.coordination.topology``. ``None``: use ``REDIS_URL``."""
        value = self._get("REDIS", None)
        return value if value else None

    @property
    def USES_EMBEDDED_REDIS(self) -> bool:
        """True when ``REACTOR_REDIS_URL = "embedded"`` (a per-machine development server)."""
        return self.REDIS_URL == EMBEDDED

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
    def LIMITS(self) -> dict[str, dict[str, Any]]:
        """Named semaphore limits, ``name -> {"limit": n}``, that ``with_semaphore(key,
        limit="name")`` refers to; an operator can override them live (docs/coordination.md,
        "Live limits"). The shape of each entry is checked where it is read
        (``coordination.live_limits.configured_semaphore_limit``)."""
        value = self._get("LIMITS", {})
        if not isinstance(value, dict):
            raise ConfigurationError(
                "REACTOR_LIMITS must be a dict of name -> {'limit': n}", setting="LIMITS"
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
    def CELERY_QUEUE(self) -> str | None:
        """Queue reactor_app's tasks go to; ``None`` (the default): Celery's default queue
        (``CELERY_TASK_DEFAULT_QUEUE``, ``"celery"`` unless changed), which a plain
        ``celery -A proj worker`` consumes."""
        value = self._get("CELERY_QUEUE", None)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise ConfigurationError(
                "REACTOR_CELERY_QUEUE must be a non-empty queue name or None",
                setting="CELERY_QUEUE",
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
        return self._seconds("TRACKING_FLUSH_INTERVAL", 0.25, allow_zero=False)

    @property
    def TRACKING_BUFFER_SIZE(self) -> int:
        """Size bound: this many buffered tracking rows wake the writer before the freshness
        bound is up (values under 64 act as 64: below that the bound is not even checked)."""
        return self._count("TRACKING_BUFFER_SIZE", 1000, minimum=1)

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
    def MAP_CHECKPOINT_EVERY(self) -> int:
        """A sequential ``map_step`` on a worker checkpoints its elements in batches: at most
        this many completed elements wait unwritten (a redelivery after a crash re-runs at most
        them; docs/operations.md, "Checkpoints"). 1 writes every element."""
        return self._count("MAP_CHECKPOINT_EVERY", 50, minimum=1)

    @property
    def LOST_DELIVERY_LIMIT(self) -> int:
        """Worker deliveries of one execution that may be lost in a row at the same point of
        its work (a killed pool process, a crash, a hard time limit) before the unit at that
        point fails with ``DeliveryLost`` instead of running again (``engine.lost_deliveries``).
        0 turns the guard off: such a unit runs again after every loss, without end."""
        return self._count("LOST_DELIVERY_LIMIT", 3, minimum=0, note="(0 turns the guard off)")

    @property
    def MAP_CHECKPOINT_SECONDS(self) -> float:
        """...and a batch is written once its oldest unwritten element is this many seconds
        old, so slow elements are checkpointed one by one as before."""
        return self._seconds("MAP_CHECKPOINT_SECONDS", 1.0, allow_zero=True)

    @property
    def API_PERMISSION_CLASSES(self) -> list[str | type]:
        """DRF permission classes of the API, or their dotted paths (imported by the API:
        ``api.permissions.configured_permissions``)."""
        value = self._get("API_PERMISSION_CLASSES", ["reactor_app.api.permissions.IsStaffUser"])
        if isinstance(value, (list, tuple)) and all(
            (isinstance(item, str) and item) or isinstance(item, type) for item in value
        ):
            return list(value)
        raise ConfigurationError(
            "REACTOR_API_PERMISSION_CLASSES must be a list of DRF permission classes or their "
            f"dotted paths, got {value!r}",
            setting="API_PERMISSION_CLASSES",
        )

    @property
    def EXECUTION_CLAIM_TTL(self) -> float:
        """Seconds a silent worker delivery keeps its claim on an execution."""
        try:  # a lifetime the claim's SET ... PX keeps: reactor_app.bounds
            return bounds.seconds_within(
                self._get("EXECUTION_CLAIM_TTL", 30.0), "REACTOR_EXECUTION_CLAIM_TTL"
            )
        except ValueError as exc:
            raise ConfigurationError(str(exc), setting="EXECUTION_CLAIM_TTL") from None

    @property
    def LONGEST_COUNTDOWN(self) -> float:
        """Seconds a message may wait in a worker before it is due: a longer countdown (a
        ``run_after``, a debounce) is sent in hops of at most this (``engine.countdowns``).
        Keep it below the broker's limit on unacknowledged deliveries: RabbitMQ's
        ``consumer_timeout`` (30 minutes by default), the Redis transport's
        ``visibility_timeout`` (1 hour)."""
        return self._seconds("LONGEST_COUNTDOWN", 600.0, allow_zero=False)

    @property
    def SWEEP_AFTER(self) -> float:
        """Seconds without a heartbeat after which the sweeper re-enqueues a running execution."""
        return self._seconds("SWEEP_AFTER", 120.0, allow_zero=False)

    @property
    def SWEEP_INTERVAL(self) -> float:
        """Seconds between two sweeps run by the workers themselves (0 turns that off, for a
        deployment that runs ``reactor_app.sweep`` from Celery beat instead)."""
        return self._seconds("SWEEP_INTERVAL", 30.0, allow_zero=True, note="(0 = no worker sweeps)")

    @property
    def EXTERNAL_SWEEP_INTERVAL(self) -> float:
        """Seconds between the sweeps scheduled outside the workers (beat, cron) when
        ``SWEEP_INTERVAL`` is 0 — default 60, the cadence of ``tasks.sweep_schedule`` and the
        finest cron can do. The holds parked executions keep are lengthened to outlast two of
        them (``engine.worker.park_margin``)."""
        return self._seconds("EXTERNAL_SWEEP_INTERVAL", 60.0, allow_zero=False)

    @property
    def ORDERED_WAIT_CEILING(self) -> int | None:
        """Parks of one unit on an ordered lock before it fails (None: unbounded)."""
        if self._get("ORDERED_WAIT_CEILING", None) is None:
            return None
        return self._count("ORDERED_WAIT_CEILING", None, minimum=1, note="or None")

    @property
    def WORKER_WAIT(self) -> float:
        """Seconds a worker delivery waits in-process for contention to clear before it parks
        (0: park at once)."""
        return self._seconds("WORKER_WAIT", 1.0, allow_zero=True)

    @property
    def CANCEL_POLL(self) -> float:
        """Seconds between two reads of a running execution's cancel flag at step boundaries
        and ``checkpoint()`` (0: read at every one). Default 0.05."""
        return self._seconds("CANCEL_POLL", 0.05, allow_zero=True)

    @property
    def RETENTION(self) -> float | None:
        """Seconds finished executions (with their step runs and events) are kept before the
        ``reactor_app.purge`` task deletes them; ``None`` keeps them forever. Default 30 days."""
        value = self._get("RETENTION", 30 * 24 * 3600.0)
        if value is None:
            return None
        if hasattr(value, "total_seconds"):  # a timedelta reads naturally in settings
            value = value.total_seconds()
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise ConfigurationError(
                "REACTOR_RETENTION must be a number of seconds > 0, a timedelta, or None",
                setting="RETENTION",
            )
        return float(value)


reactor_settings = ReactorSettings()
