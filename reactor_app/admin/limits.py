"""The Limits page (``coordination/limits/``): every named limit with its effective value and
origin (settings, or an override by whom and when), and — for users with the
``override_limit`` permission — the form that overrides one live or removes the override
(``reactor_app.operator.limits``, which audits and publishes the change).

Bad input is answered with the form and its errors (status 400), never a server error; a
change that was saved but could not be published to Redis says so (status 503).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse

from reactor_app.admin.links import url
from reactor_app.admin.pages import coordination_context
from reactor_app.exceptions import CoordinationUnavailable
from reactor_app.operator import limit_input, limits

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

#: the permission an override needs (reading the page needs only the admin view permission)
OVERRIDE_PERMISSION = "reactor_app.override_limit"


def can_override(request: HttpRequest) -> bool:
    user = request.user
    return bool(user.is_active and user.is_staff and user.has_perm(OVERRIDE_PERMISSION))


class LimitOverrideForm(forms.Form):
    """Set (``value`` given) or remove (``action=remove``) the override of one named limit."""

    primitive = forms.ChoiceField(choices=[(p, p) for p in limits.PRIMITIVES])
    name = forms.CharField(max_length=255)
    value = forms.CharField(
        max_length=255,
        required=False,
        help_text="semaphore: 5 · rate limit: 3/second, 100/minute (or 100 for one window)",
    )
    reason = forms.CharField(max_length=1000, required=False)
    action = forms.ChoiceField(
        choices=[("set", "set"), ("remove", "remove")], initial="set", required=False
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        primitive, name = data.get("primitive"), data.get("name")
        if not primitive or not name:
            return data
        setting = (data.get("action") or "set") == "set"
        try:
            limit_input.check_named(primitive, name, removing=not setting)
        except limit_input.InvalidLimit as exc:
            self.add_error("name", str(exc))
            return data
        if setting:
            try:
                data["parsed"] = limit_input.parse_value(primitive, name, data.get("value"))
            except limit_input.InvalidLimit as exc:
                self.add_error("value", str(exc))
        return data


def _page(
    model_admin: ModelAdmin, request: HttpRequest, form: LimitOverrideForm, status: int = 200
) -> HttpResponse:
    unavailable = None
    rows: list[dict[str, Any]] = []
    try:
        rows = [limit.as_dict() for limit in limits.named_limits()]
    except CoordinationUnavailable as exc:
        unavailable = exc.message
    context = coordination_context(
        model_admin,
        request,
        "Limits",
        limits=rows,
        form=form,
        can_override=can_override(request),
        unavailable=unavailable,
        refresh_seconds=limits.live_limits.REFRESH_SECONDS,
    )
    return TemplateResponse(
        request, "admin/reactor_app/coordination/limits.html", context, status=status
    )


def limits_page(model_admin: ModelAdmin, request: HttpRequest) -> HttpResponse:
    """GET: the named limits and the override form. POST: set or remove an override."""
    if request.method != "POST":
        return _page(model_admin, request, LimitOverrideForm(initial=request.GET.dict()))
    if not can_override(request):
        raise PermissionDenied(f"overriding a limit needs the {OVERRIDE_PERMISSION!r} permission")
    form = LimitOverrideForm(request.POST)
    if not form.is_valid():
        return _page(model_admin, request, form, status=400)
    data = form.cleaned_data
    primitive, name, reason = data["primitive"], data["name"], data["reason"]
    by = request.user.get_username()
    try:
        if data.get("action") == "remove":
            outcome = limits.remove_override(primitive, name, by=by, reason=reason)
            if outcome["old"] is None:
                messages.warning(request, f"{primitive} {name!r} had no override")
            else:
                messages.success(
                    request,
                    f"removed the override of {primitive} {name!r}: back to settings "
                    f"({limit_input.describe(primitive, outcome['new'])})",
                )
        else:
            outcome = limits.set_override(primitive, name, data["parsed"], by=by, reason=reason)
            was = limit_input.describe(primitive, outcome["old"]) if outcome["old"] else "settings"
            messages.success(
                request,
                f"{primitive} {name!r} is now {limit_input.describe(primitive, outcome['new'])} "
                f"(was {was})"
                + (
                    f"; woke {len(outcome['woken'])} parked execution(s)"
                    if outcome["woken"]
                    else ""
                ),
            )
    except CoordinationUnavailable as exc:
        messages.error(
            request,
            f"the change to {primitive} {name!r} is saved but could not be published to Redis "
            f"({exc.message}); processes keep the previous value until it is published again "
            "(any later change, or the workers' sweep)",
        )
        return _page(model_admin, request, LimitOverrideForm(), status=503)
    except limit_input.InvalidLimit as exc:
        form.add_error(None, str(exc))
        return _page(model_admin, request, form, status=400)
    return HttpResponseRedirect(url("limits"))
