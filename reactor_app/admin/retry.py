"""The admin's retry action: re-run a failed execution from a step, on a worker.

* On the execution page, a **Retry from a step…** button (failed root executions not retried
  yet) opens ``executions/<id>/retry/``: GET shows, step by step, what the retry reuses (a
  recorded result whose effect still stands) and what runs again (the failed step, the steps
  after it, and every step the failed run's rollback undid), and asks for the step to start
  from (the default one preselected); POST retries.
* In the executions list, the **Retry the selected failed executions** action first shows the
  same listing for each selected execution (confirmation page); confirmed, it retries each
  from its default step; the others are reported and left alone.

A retry never reuses a result whose undo ran (``reactor_app.engine.retry``): the default step
is the failed one or the first one the rollback undid, whichever is earlier, and a later step
is refused. Both need the operator permission (``reactor_app.force_release``, as every
state-changing operator action) and are audited in the admin's history (a ``LogEntry`` on the
failed execution naming the new one and the step) and in the new execution's
``context["retry"]`` (``by``: the operator). The retry always runs on a worker: a saga never
runs inside an admin request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from reactor_app.admin.permissions import require_operator
from reactor_app.dsl.registry import lookup
from reactor_app.engine.progress import load_state
from reactor_app.engine.retry import RetryPlan, retry_plan
from reactor_app.engine.state import ExecutionState
from reactor_app.exceptions import ExecutionNotRetryable, ReactorError, ReactorNotRegistered
from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin


def retryable(execution: Execution) -> bool:
    """Whether the page offers a retry (the engine checks again, under a row lock)."""
    return (
        execution.status == ExecutionStatus.FAILED
        and execution.parent_id is None
        and not execution.retries.exists()
    )


def _change_url(execution: Any) -> str:
    return reverse("admin:reactor_app_execution_change", args=[execution.pk])


def _retry(
    model_admin: ModelAdmin, request: HttpRequest, failed: Execution, step: str | None
) -> Execution:
    retried = failed.retry(from_step=step, on_worker=True, by=request.user.get_username())
    from_step = _retried_from(retried)
    model_admin.log_change(request, failed, f"Retried from step {from_step!r} as {retried.pk}.")
    return retried


def _retried_from(retried: Execution) -> str:
    origin = ExecutionState.peek(retried.context).origin.retry
    assert origin is not None  # engine.retry notes it on every retry
    return origin["from_step"]


class RetryForm(forms.Form):
    from_step = forms.ChoiceField(label="Run again from step")

    def __init__(self, *args: Any, steps: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["from_step"]
        assert isinstance(field, forms.ChoiceField)
        field.choices = [(name, name) for name in steps]


def retry_page(model_admin: ModelAdmin, request: HttpRequest, object_id: str) -> HttpResponse:
    require_operator(request, "retrying an execution")
    try:
        failed = Execution.objects.get(pk=object_id)
    except (Execution.DoesNotExist, ValidationError, ValueError) as exc:
        raise Http404(f"no execution {object_id}") from exc
    try:
        order = list(lookup(failed.reactor).plan.order)
    except ReactorNotRegistered as exc:
        messages.error(request, f"cannot retry: {exc.message}")
        return HttpResponseRedirect(_change_url(failed))
    state = load_state(failed)
    failed_step = order[state.next_index] if state.next_index < len(order) else None
    plan = _plan(failed)
    default = plan.from_step if isinstance(plan, RetryPlan) else failed_step
    form = RetryForm(
        request.POST if request.method == "POST" else None,
        initial={"from_step": default},
        steps=order,
    )
    if request.method == "POST" and form.is_valid():
        try:
            retried = _retry(model_admin, request, failed, form.cleaned_data["from_step"])
        except ExecutionNotRetryable as exc:
            messages.error(request, f"cannot retry: {exc.message}")
            return HttpResponseRedirect(_change_url(failed))
        messages.success(
            request,
            f"retrying {failed.pk} from step {_retried_from(retried)!r} as "
            f"{retried.pk} on a worker",
        )
        return HttpResponseRedirect(_change_url(retried))
    undone = set(plan.undone) if isinstance(plan, RetryPlan) else set()
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "title": f"Retry {failed.reactor_name} {failed.pk}",
        "execution": failed,
        "execution_url": _change_url(failed),
        "form": form,
        "steps": [
            {
                "name": name,
                "recorded": name in state.results,
                "undone": name in undone,
                "failed": name == failed_step,
            }
            for name in order
        ],
        "default_step": default,
        "retryable": retryable(failed),
    }
    return TemplateResponse(request, "admin/reactor_app/execution/retry.html", context)


def _plan(failed: Execution) -> RetryPlan | ReactorError:
    """What retrying ``failed`` by default would reuse and re-run, or why it cannot."""
    try:
        return retry_plan(failed)
    except (ExecutionNotRetryable, ReactorNotRegistered) as exc:
        return exc


def retry_selected(
    model_admin: ModelAdmin, request: HttpRequest, queryset: QuerySet
) -> HttpResponse | None:
    """The list action: a confirmation page listing, per execution, the steps reused and
    the steps run again (or why it cannot be retried); confirmed, retry each."""
    require_operator(request, "retrying an execution")
    executions = list(queryset)
    if request.POST.get("confirm") != "yes":
        context = {
            **model_admin.admin_site.each_context(request),
            "opts": model_admin.model._meta,
            "title": "Retry executions" if len(executions) != 1 else "Retry execution",
            "plans": [_listing(execution) for execution in executions],
            "action_checkbox_name": ACTION_CHECKBOX_NAME,
            "changelist_url": reverse("admin:reactor_app_execution_changelist"),
        }
        return TemplateResponse(request, "admin/reactor_app/execution/retry_confirm.html", context)
    for failed in executions:
        try:
            retried = _retry(model_admin, request, failed, None)
        except (ExecutionNotRetryable, ReactorNotRegistered) as exc:
            messages.warning(request, f"{failed.pk}: {exc.message}")
            continue
        messages.success(
            request,
            f"{failed.pk}: retrying from step {_retried_from(retried)!r} as {retried.pk} "
            "on a worker",
        )
    return None


def _listing(execution: Execution) -> dict[str, Any]:
    plan = _plan(execution)
    if isinstance(plan, RetryPlan):
        return {
            "execution": execution,
            "from_step": plan.from_step,
            "reused": plan.reused,
            "rerun": plan.rerun,
            "undone": [name for name in plan.undone if name in plan.rerun],
        }
    return {"execution": execution, "refused": plan.message}
