"""The one error tree of reactor_app.

Every class's docstring is its default message, and every error carries structured fields
(``fields()``) so callers, the ORM and the API never have to parse text.
"""

from __future__ import annotations

from typing import Any, ClassVar

from reactor_app.storable import storable


def location(reactor: str | None, step: str | None) -> str:
    """Where an error happened, as its message names it: ``step 'charge' of shop.PlaceOrder``.

    A ``Step.call`` runs outside any reactor: it is named as a direct call, never with an empty
    or made-up reactor ("of ?", "of ").
    """
    if step and reactor:
        return f"step {step!r} of {reactor}"
    if step:
        return f"step {step!r} (a direct Step.call)"
    if reactor:
        return f"reactor {reactor}"
    return "a direct Step.call"


class ReactorError(Exception):
    """A reactor_app error occurred."""

    #: names of the structured attributes this class carries; ``__init__`` sets them. Each
    #: class also declares them as annotations, so that reading one is type-checked.
    field_names: ClassVar[tuple[str, ...]] = ()

    def __init__(self, message: str | None = None, **fields: Any) -> None:
        self.message = message or (type(self).__doc__ or type(self).__name__).strip()
        for name in self.field_names:
            setattr(self, name, fields.pop(name, None))
        self.extra = fields
        super().__init__(self.message)

    def fields(self) -> dict[str, Any]:
        """Structured fields (JSON-friendly) of this error."""
        data = {name: getattr(self, name) for name in self.field_names}
        data.update(self.extra)
        return {k: _jsonable(v) for k, v in data.items()}

    def as_dict(self) -> dict[str, Any]:
        """The error as stored on an execution and served by the API: storable whatever the
        message quotes (an exception's text with a NUL character failed the run's final
        write: ``reactor_app.storable``)."""
        data = {"type": type(self).__name__, "message": self.message, **self.fields()}
        return storable(data)  # type: ignore[no-any-return]

    def fill_location(self, *, reactor: str | None, step: str | None) -> None:
        """Name the reactor and step where this error was raised, for a class that carries
        those fields and was raised without them (by a step body, which does not know its
        label). Which fields a class has is only known at run time, hence the lookups."""
        for name, value in (("step", step), ("reactor", reactor)):
            if getattr(self, name, "absent") is None:
                setattr(self, name, value)

    def __reduce__(self) -> Any:
        return (_rebuild, (type(self), self.message, {**self.fields(), **self.extra}))


def _rebuild(cls: type[ReactorError], message: str, fields: dict[str, Any]) -> ReactorError:
    return cls(message, **fields)


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, BaseException):
        return {"type": type(value).__name__, "message": str(value)}
    return str(value)


class DefinitionError(ReactorError):
    """The reactor or step definition is invalid."""

    field_names: ClassVar[tuple[str, ...]] = ("owner", "option")
    owner: Any
    option: str | None


class ConfigurationError(ReactorError):
    """A REACTOR_* setting is invalid."""

    field_names: ClassVar[tuple[str, ...]] = ("setting",)
    setting: str | None


class InputValidationError(ReactorError):
    """The inputs or arguments did not validate."""

    field_names: ClassVar[tuple[str, ...]] = ("reactor", "step", "field_errors")
    reactor: str | None
    step: str | None
    field_errors: dict[str, Any] | None


class InputNotSerializable(InputValidationError, TypeError):
    """An input cannot be stored for a worker to read back as the same value."""


class IdempotencyKeyReused(InputValidationError):
    """The idempotency key was already used for a different call."""

    field_names: ClassVar[tuple[str, ...]] = ("reactor", "step", "field_errors", "execution_id")
    execution_id: str | None


class ReactorNotRegistered(ConfigurationError):
    """The reactor of this execution cannot be imported in this process."""

    field_names: ClassVar[tuple[str, ...]] = ("setting", "reactor", "cause")
    reactor: str | None
    cause: Any


class ArgumentResolutionError(ReactorError):
    """A step argument could not be resolved."""

    field_names: ClassVar[tuple[str, ...]] = ("reactor", "step", "argument", "source")
    reactor: str | None
    step: str | None
    argument: str | None
    source: str | None


class StepFailed(ReactorError):
    """A step failed."""

    field_names: ClassVar[tuple[str, ...]] = ("reactor", "step", "cause")
    reactor: str | None
    step: str | None
    cause: Any


class FailureReason(Exception):
    """What a step body gave as the error of ``Failure(error)`` when that is not an exception
    (``Failure("out of stock")``), as the exception ``compensate`` receives.

    Not a ``ReactorError``: the library did not fail, the body said why it did. Nothing was
    raised, so reports name no exception type — the step's error reads "failed: out of stock"
    and its ``cause`` is the value itself (``error``), never an invented ``RuntimeError``.
    """

    def __init__(self, error: Any) -> None:
        super().__init__("" if error is None else str(error))
        self.error = error

    @staticmethod
    def describe(cause: BaseException) -> str:
        """A failure's cause as its report reads it: ``Type: message`` for a raised exception,
        the message alone for a plain reason (nothing was raised)."""
        if isinstance(cause, FailureReason):
            return str(cause)
        return f"{type(cause).__name__}: {cause}"

    @staticmethod
    def reported(cause: BaseException) -> Any:
        """What a step error stores as its ``cause``: the exception, or a plain reason as is."""
        return cause.error if isinstance(cause, FailureReason) else cause


class RetriesExhausted(StepFailed):
    """A step failed on every attempt."""

    field_names: ClassVar[tuple[str, ...]] = ("reactor", "step", "cause", "attempts")
    attempts: int | None


class TaskTimeLimitExceeded(ReactorError):
    """A step body ran past its Celery task's soft time limit, having had the whole limit."""

    field_names: ClassVar[tuple[str, ...]] = ("reactor", "step", "limit")
    reactor: str | None
    step: str | None
    limit: float | None


class DeliveryLost(ReactorError):
    """A unit whose worker deliveries were lost ``lost`` times in a row, none of them getting
    past it (a body or hook that kills its process: out of memory, a crash in native code, a
    hard time limit), is failed instead of run again (``REACTOR_LOST_DELIVERY_LIMIT``;
    ``engine.lost_deliveries``)."""

    field_names: ClassVar[tuple[str, ...]] = ("reactor", "step", "lost", "limit")
    reactor: str | None
    step: str | None
    lost: int | None
    limit: int | None
    #: not a field: the engine gave this verdict once before at the same point (the step's
    #: compensate is passed over: ``engine.lost_deliveries.skips_compensate``)
    again: bool = False


class CompensationFailed(ReactorError):
    """A step's compensation failed."""

    field_names: ClassVar[tuple[str, ...]] = ("reactor", "step", "cause")
    reactor: str | None
    step: str | None
    cause: Any


class UndoFailed(ReactorError):
    """A step's undo failed."""

    field_names: ClassVar[tuple[str, ...]] = ("reactor", "step", "cause")
    reactor: str | None
    step: str | None
    cause: Any


class TaskFunctionFailed(ReactorError):
    """A ``django.tasks`` task function raised (``reactor_app.tasks_backend``): the exception's
    class path and traceback, which the task API's ``TaskResult.errors`` reports."""

    field_names: ClassVar[tuple[str, ...]] = ("reactor", "step", "exception_class", "traceback")
    reactor: str | None
    step: str | None
    exception_class: str | None
    traceback: str | None


class ExecutionNotResumable(ReactorError):
    """The execution is not waiting at that interrupt."""

    field_names: ClassVar[tuple[str, ...]] = ("execution_id", "step", "status")
    execution_id: str | None
    step: str | None
    status: str | None


class ExecutionNotRetryable(ReactorError):
    """The execution cannot be retried from that step (not failed, not a root, already
    retried, or an unknown step)."""

    field_names: ClassVar[tuple[str, ...]] = ("execution_id", "step", "status")
    execution_id: str | None
    step: str | None
    status: str | None


class ExecutionCancelled(ReactorError):
    """The execution was cancelled by an operator; its completed steps were rolled back."""

    field_names: ClassVar[tuple[str, ...]] = ("reactor", "step", "execution_id", "reason", "by")
    reactor: str | None
    step: str | None
    execution_id: str | None
    reason: str | None
    by: str | None


class ExecutionNotCancellable(ReactorError):
    """The execution has already ended (succeeded, failed, halted or cancelled)."""

    field_names: ClassVar[tuple[str, ...]] = ("execution_id", "status")
    execution_id: str | None
    status: str | None


class CoordinationError(ReactorError):
    """Coordination refused or could not run the work."""

    field_names: ClassVar[tuple[str, ...]] = ("reactor", "step", "key", "primitive")
    reactor: str | None
    step: str | None
    key: str | None
    primitive: str | None


class LockAcquisitionError(CoordinationError):
    """The lock is held by another execution."""

    field_names: ClassVar[tuple[str, ...]] = (
        "reactor",
        "step",
        "key",
        "primitive",
        "retry_after",
        "holder",
    )
    retry_after: float | None
    holder: Any


class SemaphoreAcquisitionError(CoordinationError):
    """Every slot of the semaphore is taken."""

    field_names: ClassVar[tuple[str, ...]] = (
        "reactor",
        "step",
        "key",
        "primitive",
        "retry_after",
        "limit",
    )
    retry_after: float | None
    limit: int | None


class RateLimitExceeded(CoordinationError):
    """The rate limit is exhausted for the current window."""

    field_names: ClassVar[tuple[str, ...]] = (
        "reactor",
        "step",
        "key",
        "primitive",
        "retry_after",
        "limit",
        "period",
    )
    retry_after: float | None
    limit: int | None
    period: Any


class OrderedLockWaitError(CoordinationError):
    """An earlier position of the ordered lock has not finished."""

    field_names: ClassVar[tuple[str, ...]] = (
        "reactor",
        "step",
        "key",
        "primitive",
        "nonce",
        "last_completed",
        "retry_after",
    )
    nonce: Any
    last_completed: Any
    retry_after: float | None


class PeriodInFlightError(CoordinationError):
    """Another execution is running this period bucket; it is neither done nor free yet."""

    field_names: ClassVar[tuple[str, ...]] = (
        "reactor",
        "step",
        "key",
        "primitive",
        "retry_after",
        "holder",
        "bucket",
    )
    retry_after: float | None
    holder: Any
    bucket: Any


class CoordinationKeyError(CoordinationError):
    """The coordination key function raised or returned nothing."""

    field_names: ClassVar[tuple[str, ...]] = ("reactor", "step", "key", "primitive", "cause")
    cause: Any


class RateLimitCostError(CoordinationKeyError):
    """The cost a weighted rate limit would charge is invalid (below 1, not an integer, or more
    than a window's whole budget, so it could never be admitted); the work did not run."""

    field_names: ClassVar[tuple[str, ...]] = (
        "reactor",
        "step",
        "key",
        "primitive",
        "cause",
        "cost",
        "limit",
        "period",
    )
    cost: Any
    limit: int | None
    period: Any


class ContentionCeilingExceeded(CoordinationError):
    """The step was parked on contention more times than REACTOR_CONTENTION_CEILING allows."""

    field_names: ClassVar[tuple[str, ...]] = ("reactor", "step", "key", "primitive", "attempts")
    attempts: int | None


class HandOffRefused(CoordinationError):
    """Handing this work to another process would deadlock on a key the execution holds."""

    field_names: ClassVar[tuple[str, ...]] = ("reactor", "step", "key", "primitive", "holder")
    holder: Any


class CoordinationUnavailable(CoordinationError):
    """The coordination store is unreachable. When a step's or a reactor's admission meets it,
    the protected work did not run (the gate's message says so); a release or a renewal that
    meets it comes after the work began (the holds lapse with their leases)."""

    field_names: ClassVar[tuple[str, ...]] = ("reactor", "step", "key", "primitive", "cause")
    cause: Any


class CoordinationOutOfMemory(CoordinationUnavailable):
    """The coordination Redis reached its ``maxmemory`` and refuses writes (policy
    ``noeviction``): nothing was taken, as for an unreachable one."""


class LeaseLost(CoordinationError):
    """The lock's lease could not be renewed; the key may now belong to someone else."""

    field_names: ClassVar[tuple[str, ...]] = ("reactor", "step", "key", "primitive", "token")
    token: int | None
