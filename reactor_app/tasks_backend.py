"""A ``django.tasks`` backend: ``@task`` functions run on the Celery workers as executions.

Django 6 ships a task API (``django.tasks``: ``@task``, ``.enqueue()``, ``get_result``), and
the ``django-tasks`` package backports it to Django 4.2 to 5.2. Its backends run a function
somewhere; none coordinates. This one turns each enqueued call into an ``Execution`` of a
one-step reactor built for the task function, so a task gets what a reactor gets: a tracked
row (admin, API, events), the outbox guarantee of ``run_async``, and the coordination
decorators — ``@with_lock(lambda args: f"acct:{args['account_id']}")`` stacked on ``@task``
serializes the calls for one account, parking (never failing) contended calls on a worker.

How a task becomes a reactor (docs/tasks.md has the user's view):

* ``validate_task`` — which the task API calls for every ``Task`` it builds, in every process
  that imports the task's module — files a factory for the task's reactor under the path
  ``<module>.<function>.reactor``. The reactor is built on first use (``lookup`` in a worker,
  ``enqueue`` in the caller), after the module finished importing, so the ``with_*`` decorators
  stacked above ``@task`` have all recorded their declarations on the function by then.
* The reactor has two inputs: ``arguments`` (the call's arguments bound to the function's
  parameter names, defaults applied) and ``task`` (priority, queue, backend, ``run_after``).
  Its one step, ``call``, takes each parameter as a step argument — which is what a key
  function reads as ``args`` — and returns the function's value, JSON-normalised as the task
  API requires.
* ``run_after`` is honoured twice over: the Celery message carries the countdown, and the row
  is stored with its heartbeat at the due time, so the sweeper (which re-sends pending rows
  whose heartbeat is older than ``REACTOR_SWEEP_AFTER``) can only re-send it after it is due.
* ``priority`` is ``run_async``'s (the same -100 to 100): the Celery message's priority
  (``engine.priority.celery_priority`` maps it onto the broker's 0 to 9; brokers that order
  by priority honour it, others ignore it) and the execution's place among the waiters of a
  contended key.
* ``get_result`` reads the execution row: its status, timestamps, the error, one attempt per
  ``StepRun`` of the step, and the arguments and return value decoded from the codec's form.
"""

from __future__ import annotations

import inspect
import uuid
from dataclasses import replace
from datetime import datetime
from traceback import format_exception
from typing import TYPE_CHECKING, Any

from reactor_app.dsl.arguments import from_input
from reactor_app.dsl.declarations import DECLARATIONS_ATTR, DeclarationSet, record_on_class
from reactor_app.dsl.outcome import Failure, Success
from reactor_app.dsl.reactor import Reactor
from reactor_app.dsl.registry import lookup, register_factory
from reactor_app.dsl.step import Step, step
from reactor_app.engine.enqueueing import run_async
from reactor_app.exceptions import ReactorNotRegistered, TaskFunctionFailed
from reactor_app.models import Execution, StepRun
from reactor_app.serialization import decode
from reactor_app.status import ExecutionStatus, StepRunKind

if TYPE_CHECKING:
    from reactor_app.engine.context import StepContext

try:  # Django 6
    from django.tasks import TaskContext, TaskResult, TaskResultStatus
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskError
    from django.tasks.exceptions import InvalidTask as InvalidTaskError
    from django.tasks.exceptions import TaskResultDoesNotExist
    from django.utils.json import normalize_json
except ImportError:  # the django-tasks backport (Django 4.2 to 5.2)
    from django_tasks import (  # type: ignore[no-redef,assignment]
        TaskContext,
        TaskResult,
        TaskResultStatus,
    )
    from django_tasks.backends.base import BaseTaskBackend  # type: ignore[no-redef,assignment]
    from django_tasks.base import Task, TaskError  # type: ignore[no-redef,assignment]
    from django_tasks.exceptions import (  # type: ignore[no-redef,assignment]
        InvalidTaskError,
        TaskResultDoesNotExist,
    )
    from django_tasks.utils import normalize_json  # type: ignore[no-redef,assignment]

#: the task API's default priority (``DEFAULT_TASK_PRIORITY``)
DEFAULT_PRIORITY = 0
#: the name of the task reactor's one step (and the step a key function runs in)
CALL_STEP = "call"
#: the attribute of a task reactor naming the ``Task`` it runs
TASK_ATTR = "django_task"

_STATUSES = {
    ExecutionStatus.PENDING: TaskResultStatus.READY,
    ExecutionStatus.PARKED: TaskResultStatus.READY,
    ExecutionStatus.RUNNING: TaskResultStatus.RUNNING,
    ExecutionStatus.INTERRUPTED: TaskResultStatus.RUNNING,
    ExecutionStatus.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    ExecutionStatus.FAILED: TaskResultStatus.FAILED,
    ExecutionStatus.HALTED: TaskResultStatus.FAILED,
    ExecutionStatus.CANCELLED: TaskResultStatus.FAILED,
    ExecutionStatus.SUPERSEDED: TaskResultStatus.FAILED,
}


def reactor_path(task: Task) -> str:
    """Where the reactor of ``task`` is filed: beside the function, so a worker that imports
    the function's module finds it (``dsl.registry.lookup`` imports the longest importable
    prefix of the path)."""
    return f"{task.func.__module__}.{task.func.__qualname__}.reactor"


class ReactorTaskBackend(BaseTaskBackend):
    """Runs ``@task`` functions as tracked executions on the Celery workers."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def validate_task(self, task: Task) -> None:
        if task.run_after is not None and not isinstance(task.run_after, datetime):
            # before the task API's own check, which reads it as a datetime
            raise InvalidTaskError(
                f"run_after must be a datetime, not {type(task.run_after).__name__}"
            )
        super().validate_task(task)
        path = reactor_path(task)
        register_factory(path, lambda: _build_reactor(task, path))

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        self.validate_task(task)
        reactor = lookup(reactor_path(task))
        try:
            bound = inspect.signature(task.func).bind(
                *(("context",) if task.takes_context else ()), *args, **kwargs
            )
        except TypeError as exc:
            raise InvalidTaskError(f"cannot call {task.module_path}: {exc}") from exc
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        if task.takes_context:
            arguments.pop(next(iter(arguments)))
        try:
            # the task API's rule: arguments are JSON values (a tuple arrives as a list)
            normalized = normalize_json(arguments)
        except (TypeError, ValueError) as exc:
            raise InvalidTaskError(f"cannot enqueue {task.module_path}: {exc}") from exc
        arguments = normalized if isinstance(normalized, dict) else arguments
        options = {
            "priority": task.priority,
            "queue_name": task.queue_name,
            "backend": self.alias,
            "run_after": task.run_after.isoformat() if task.run_after else None,
        }
        execution = run_async(
            reactor,
            {"arguments": arguments, "task": options},
            run_after=task.run_after,
            # the task API's scale is run_async's: the message's priority and the waiters'
            priority=None if task.priority == DEFAULT_PRIORITY else task.priority,
        )
        return self._result(task, execution)

    def get_result(self, result_id: str) -> TaskResult:
        execution = Execution.objects.filter(pk=_uuid_or_none(result_id)).first()
        if execution is None:
            raise TaskResultDoesNotExist(result_id)
        try:
            reactor = lookup(execution.reactor)
        except ReactorNotRegistered as exc:
            raise TaskResultDoesNotExist(result_id) from exc
        task = getattr(reactor, TASK_ATTR, None)
        if task is None:
            raise TaskResultDoesNotExist(f"{result_id} is an execution of a reactor, not a task")
        return self._result(task, execution)

    def _result(self, task: Task, execution: Execution) -> TaskResult:
        # the row keeps inputs and result in the codec's form, where a float the database
        # would not give back as itself is tagged (``serialization``): the task API's
        # arguments and return value are the values, so they are decoded
        inputs = decode(execution.inputs)
        options = inputs.get("task", {})
        run_after = options.get("run_after")
        task = task.using(
            priority=options.get("priority"),
            queue_name=options.get("queue_name"),
            backend=options.get("backend"),
            run_after=datetime.fromisoformat(run_after) if run_after else None,
        )
        attempts = list(
            StepRun.objects.filter(execution=execution, step=CALL_STEP, kind=StepRunKind.RUN)
            .order_by("attempt", "started_at")
            .values_list("started_at", flat=True)
        )
        status = _STATUSES[ExecutionStatus(execution.status)]
        result: TaskResult = TaskResult(
            task=task,
            id=str(execution.pk),
            status=status,
            enqueued_at=execution.created_at,
            started_at=execution.started_at,
            finished_at=execution.finished_at,
            last_attempted_at=attempts[-1] if attempts else None,
            args=[],
            kwargs=inputs.get("arguments", {}),
            backend=self.alias,
            errors=_errors(execution),
            worker_ids=[str(execution.pk)] * len(attempts),
        )
        if status == TaskResultStatus.SUCCESSFUL:
            object.__setattr__(result, "_return_value", decode(execution.result))
        return result


def _uuid_or_none(value: str) -> str | None:
    """``value`` as an execution id, or None: a result id that is not a UUID names no row."""
    try:
        return str(uuid.UUID(str(value)))
    except ValueError:
        return None


def _errors(execution: Execution) -> list[TaskError]:
    """The failure of the execution, as the task API reports errors: the exception's class
    path (``TaskError.exception_class`` imports it back) and its traceback. A failure that is
    not the function's own (a contention failure, a cancel) names reactor_app's error class."""
    error = execution.error
    if not isinstance(error, dict):
        return []
    path = error.get("exception_class") or f"reactor_app.exceptions.{error.get('type')}"
    return [
        TaskError(
            exception_class_path=str(path),
            traceback=str(error.get("traceback") or error.get("message") or ""),
        )
    ]


def _build_reactor(task: Task, path: str) -> type[Reactor]:
    """The one-step reactor that runs ``task`` (see the module docstring)."""
    func = task.func
    signature = inspect.signature(func)
    parameters = list(signature.parameters)
    context_parameter = parameters.pop(0) if task.takes_context else None

    def run(self: Step, args: dict[str, Any], context: StepContext) -> Success | Failure:
        arguments = {name: args[name] for name in parameters}
        if context_parameter is not None:
            execution_id = str(context.execution_id)
            current = task.get_backend().get_result(execution_id)
            # this attempt's own step run is written behind the work: count it from the context
            current = replace(current, worker_ids=[execution_id] * context.attempt)
            arguments = {context_parameter: TaskContext(task_result=current), **arguments}
        bound = inspect.BoundArguments(signature, arguments)  # type: ignore[arg-type]
        try:
            value = task.call(*bound.args, **bound.kwargs)
        except Exception as exc:
            # kept whole for ``get_result``: the task API reports the class path and traceback
            # (a task is attempted once: the task API has no retries to spend)
            failed = TaskFunctionFailed(
                f"{type(exc).__name__}: {exc}",
                exception_class=f"{type(exc).__module__}.{type(exc).__qualname__}",
                traceback="".join(format_exception(exc)),
            )
            return Failure(failed, retryable=False)
        return Success(normalize_json(value))

    step_class = type(
        f"{func.__name__}_call",
        (Step,),
        {"inputs": tuple(parameters), "run": run, "__module__": func.__module__},
    )
    declarations: DeclarationSet = getattr(func, DECLARATIONS_ATTR, DeclarationSet())
    for declaration in declarations.ordered():
        record_on_class(declaration, step_class)
    wiring = {name: from_input("arguments", name) for name in parameters}
    attrs: dict[str, Any] = {
        "__module__": func.__module__,
        "__qualname__": path.removeprefix(f"{func.__module__}."),
        "inputs": ("arguments", "task"),
        CALL_STEP: step(step_class, **wiring),
        "returns": CALL_STEP,
        TASK_ATTR: task,
    }
    return type(f"{func.__name__}_reactor", (Reactor,), attrs)
