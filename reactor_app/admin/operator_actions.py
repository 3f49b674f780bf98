"""The operator actions on live coordination state: ``coordination/force-release/``,
``coordination/ordered-skip/`` and ``coordination/ordered-reset/``. GET shows what would change
and asks to confirm; POST does it (``reactor_app.operator.operations``), which records an audit
event. Each needs the operator permission (``permissions``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import messages
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse

from reactor_app.admin.forms import ForceReleaseForm, OrderedKeyForm
from reactor_app.admin.links import url
from reactor_app.admin.pages import (
    coordination_context,
    decorate_holds,
    inspect_report,
    live_hold_limit,
)
from reactor_app.admin.permissions import require_operator
from reactor_app.exceptions import CoordinationUnavailable
from reactor_app.operator import live, operations

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin


def _confirm(
    model_admin: ModelAdmin,
    request: HttpRequest,
    *,
    title: str,
    action: str,
    form: forms.Form,
    state: dict[str, Any] | None,
    description: str,
    danger: str,
) -> HttpResponse:
    context = coordination_context(
        model_admin,
        request,
        title,
        action=action,
        form=form,
        state=state,
        description=description,
        danger=danger,
    )
    return TemplateResponse(request, "admin/reactor_app/coordination/confirm.html", context)


def _operator_name(request: HttpRequest) -> str:
    return request.user.get_username()


def _back() -> HttpResponseRedirect:
    return HttpResponseRedirect(url("changelist") + "#holds")


def force_release_page(model_admin: ModelAdmin, request: HttpRequest) -> HttpResponse:
    """GET: what would be released (confirm). POST: release it and record ``forced_release``."""
    require_operator(request, "changing live coordination state")
    form = ForceReleaseForm(request.POST if request.method == "POST" else request.GET)
    if not form.is_valid():
        messages.error(request, f"cannot force-release: {form.errors.as_text()}")
        return HttpResponseRedirect(url("changelist"))
    primitive, key = form.cleaned_data["primitive"], form.cleaned_data["key"]
    owner = form.cleaned_data["owner"] or None
    try:
        if request.method == "POST":
            outcome = operations.force_release(primitive, key, owner, by=_operator_name(request))
            if outcome["released"]:
                messages.success(
                    request,
                    f"force-released {primitive} {key!r} held by {', '.join(outcome['released'])}"
                    + (f"; woke {len(outcome['woken'])} waiter(s)" if outcome["woken"] else ""),
                )
            else:
                messages.warning(request, f"{primitive} {key!r} was not held; nothing released")
            return _back()
        holders = live.hold_page(key=key, primitive=primitive, limit=live_hold_limit()).rows
        if owner:
            holders = [h for h in holders if h["owner"] == owner]
    except CoordinationUnavailable as exc:
        messages.error(request, exc.message)
        return HttpResponseRedirect(url("changelist"))
    except DatabaseError as exc:
        # the release was applied; its audit row was not written (tracking.record_coordination)
        messages.error(
            request,
            f"force-released {primitive} {key!r}, but its audit row could not be written: {exc}",
        )
        return HttpResponseRedirect(url("changelist"))
    return _confirm(
        model_admin,
        request,
        title=f"Force-release {primitive} {key}",
        action=url("force_release"),
        form=form,
        state={"holders": decorate_holds(holders, operate=False)},
        description=(
            f"Remove the {primitive} hold on {key!r}"
            + (f" owned by {owner}" if owner else " (every holder)")
            + " whatever its nesting count. The next parked waiter is woken."
        ),
        danger=(
            "The holder is not stopped: its work keeps running and its next renewal reports "
            "LeaseLost. Another execution may enter at once — use the fencing token downstream."
        ),
    )


def _ordered_action(model_admin: ModelAdmin, request: HttpRequest, *, verb: str) -> HttpResponse:
    require_operator(request, "changing live coordination state")
    form = OrderedKeyForm(request.POST if request.method == "POST" else request.GET)
    if not form.is_valid():
        messages.error(request, f"cannot {verb} ordered lock: {form.errors.as_text()}")
        return HttpResponseRedirect(url("changelist"))
    key = form.cleaned_data["key"]
    try:
        if request.method == "POST":
            if verb == "skip":
                skipped = operations.ordered_skip(key, by=_operator_name(request))["skipped"]
                if skipped is None:
                    messages.warning(request, f"nobody waits on ordered lock {key!r}")
                else:
                    messages.success(request, f"skipped position {skipped} of {key!r}")
            else:
                epoch = operations.ordered_reset(key, by=_operator_name(request))["epoch"]
                messages.success(request, f"reset ordered lock {key!r} (epoch {epoch})")
            return HttpResponseRedirect(
                url("changelist", primitive="ordered_lock", key=key) + "#inspect"
            )
        state = inspect_report("ordered_lock", key)
    except CoordinationUnavailable as exc:
        messages.error(request, exc.message)
        return HttpResponseRedirect(url("changelist"))
    except DatabaseError as exc:
        # the action was applied; its audit row was not written (tracking.record_coordination)
        messages.error(
            request,
            f"{verb} of ordered lock {key!r} applied, but its audit row could not be "
            f"written: {exc}",
        )
        return HttpResponseRedirect(url("changelist"))
    if verb == "skip":
        description = (
            f"Complete the head of {key!r} (position {state['ordered']['head'] or '-'}) without "
            "running it; the next position may enter."
        )
        danger = "The skipped execution, if alive, finds its position passed and must re-queue."
    else:
        description = (
            f"Start a new epoch of {key!r}: the line is emptied and a strict-mode failure "
            "is cleared."
        )
        danger = "Every waiting position becomes stale; those executions re-queue at the end."
    return _confirm(
        model_admin,
        request,
        title=f"{'Skip head of' if verb == 'skip' else 'Reset'} ordered lock {key}",
        action=url(f"ordered_{verb}"),
        form=form,
        state={"ordered": state["ordered"]},
        description=description,
        danger=danger,
    )


def ordered_skip_page(model_admin: ModelAdmin, request: HttpRequest) -> HttpResponse:
    return _ordered_action(model_admin, request, verb="skip")


def ordered_reset_page(model_admin: ModelAdmin, request: HttpRequest) -> HttpResponse:
    return _ordered_action(model_admin, request, verb="reset")
