"""Cancelling executions from the admin: a changelist action and a button on the execution page.

Both need staff with the ``reactor_app.cancel_execution`` permission, both go through a
confirmation page that lists what will be cancelled and asks for a reason, and both call
``Execution.cancel`` (``engine.cancel``), which records a ``cancelled`` ``CoordinationEvent``
naming the operator — the same audit trail as a force-release — and returns at once: the
rollback runs on a worker (or in the process running the execution), never in the request.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import ModelAdmin
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from reactor_app.exceptions import ExecutionNotCancellable, ReactorError
from reactor_app.models import Execution

CANCEL_PERMISSION = "reactor_app.cancel_execution"


class CancelForm(forms.Form):
    reason = forms.CharField(
        max_length=1000,
        required=False,
        widget=forms.TextInput(attrs={"size": 60}),
        help_text="why: stored on the execution and in the audit event",
    )


def can_cancel(request: HttpRequest) -> bool:
    user = request.user
    return bool(user.is_active and user.is_staff and user.has_perm(CANCEL_PERMISSION))


def _require(request: HttpRequest) -> None:
    if not can_cancel(request):
        raise PermissionDenied(f"cancelling executions needs the {CANCEL_PERMISSION!r} permission")


def _cancel_all(request: HttpRequest, executions: list[Execution], reason: str) -> None:
    """Cancel each, one message per outcome (an ended one is reported, not an error page)."""
    by = request.user.get_username()
    ended: list[str] = []
    stopping: list[str] = []
    refused: list[str] = []
    for execution in executions:
        try:
            row = execution.cancel(reason, by=by)
        except ExecutionNotCancellable as exc:
            refused.append(exc.message)
            continue
        except ReactorError as exc:  # Redis unreachable...
            refused.append(f"{execution.pk}: {exc.message}")
            continue
        (ended if row.is_terminal else stopping).append(str(row.pk))
    if ended:
        messages.success(request, f"cancelled {len(ended)} execution(s): {', '.join(ended)}")
    if stopping:
        messages.info(
            request,
            f"{len(stopping)} execution(s) asked to stop: a worker delivery (or the process "
            "running it, at its next step boundary) rolls each back and ends it cancelled: "
            + ", ".join(stopping),
        )
    for message in refused:
        messages.warning(request, message)


def _confirm(
    model_admin: ModelAdmin,
    request: HttpRequest,
    executions: list[Execution],
    form: CancelForm,
    *,
    action: str,
    selected: bool,
) -> HttpResponse:
    opts = model_admin.model._meta
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Cancel executions" if len(executions) != 1 else "Cancel execution",
        "opts": opts,
        "executions": executions,
        "form": form,
        "action": action,
        "selected": selected,
        "action_checkbox_name": ACTION_CHECKBOX_NAME,
        "changelist_url": reverse("admin:reactor_app_execution_changelist"),
    }
    return TemplateResponse(request, "admin/reactor_app/execution/cancel_confirm.html", context)


@admin.action(description="Cancel selected executions", permissions=["cancel"])
def cancel_selected(
    model_admin: ModelAdmin, request: HttpRequest, queryset: QuerySet
) -> HttpResponse | None:
    """The changelist action: confirm (with a reason) first, then cancel."""
    _require(request)
    executions = list(queryset)
    if request.POST.get("confirm") == "yes":
        form = CancelForm(request.POST)
        if form.is_valid():
            _cancel_all(request, executions, form.cleaned_data["reason"])
            return None  # back to the changelist
    else:
        form = CancelForm()
    return _confirm(model_admin, request, executions, form, action="", selected=True)


def cancel_page(model_admin: ModelAdmin, request: HttpRequest, object_id: str) -> HttpResponse:
    """The execution page's button: GET confirms, POST cancels and returns to the page."""
    _require(request)
    try:
        execution = Execution.objects.get(pk=object_id)
    except (Execution.DoesNotExist, ValidationError, ValueError) as exc:  # not even a UUID
        raise Http404(f"no execution {object_id}") from exc
    page = reverse("admin:reactor_app_execution_change", args=[execution.pk])
    form = CancelForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        _cancel_all(request, [execution], form.cleaned_data["reason"])
        return HttpResponseRedirect(page)
    return _confirm(
        model_admin,
        request,
        [execution],
        form,
        action=reverse("admin:reactor_app_execution_cancel", args=[execution.pk]),
        selected=False,
    )


def page_context(request: HttpRequest, execution: Any) -> dict[str, Any]:
    """What the execution page's template needs to show the button."""
    if execution is None or execution.is_terminal or not can_cancel(request):
        return {}
    return {"cancel_url": reverse("admin:reactor_app_execution_cancel", args=[execution.pk])}
