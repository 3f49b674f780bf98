"""The Coordination page (``coordination/``): live holds from the live-holds index, 50 a page
(step-level beside reactor-level), searchable by key prefix, step and reactor, filtered by
primitive and level, with totals per primitive; semaphore occupancy of the listed holds; and the
state of keys asked about or recently seen (rate-limit windows, period marks, ordered-lock
head/next/first-failed); and every named limit with its effective value and origin (settings,
or an operator's override: ``admin.limits``)."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone

from reactor_app.admin.forms import HOLD_ORDER_LABELS, HoldSearchForm, InspectForm, TimelineForm
from reactor_app.admin.links import url
from reactor_app.admin.pages import coordination_context, decorate_holds, inspect_report
from reactor_app.admin.permissions import can_operate
from reactor_app.exceptions import CoordinationUnavailable
from reactor_app.models import CoordinationEvent
from reactor_app.operator import limits, live

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

#: how far back "recently seen keys" look, and how many of them are inspected
RECENT_MINUTES = 60
RECENT_KEYS = 30
#: live holds per page of the Coordination page (read from the live-holds index)
HOLDS_PER_PAGE = 50


def _hold_links(
    request: HttpRequest, name: str, values: list[str], labels: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """Filter (or order) links for one hold parameter: each keeps the others, drops the
    cursor. ``labels``: a link's text by value (default: the value; "all" for none)."""
    links = []
    for value in ["", *values]:
        query = request.GET.copy()
        query.pop("cursor", None)
        query[name] = value
        current = request.GET.get(name, "") == value
        label = (labels or {}).get(value) or value or "all"
        links.append({"label": label, "url": f"?{query.urlencode()}", "current": current})
    return links


def coordination_page(model_admin: ModelAdmin, request: HttpRequest) -> HttpResponse:
    """Live holds, semaphore occupancy, and the state of asked-about and recent keys."""
    operate = can_operate(request)
    unavailable: str | None = None
    holds: list[dict[str, Any]] = []
    search = HoldSearchForm(request.GET)
    page: live.HoldsPage | None = None
    next_url: str | None = None
    try:
        page = live.hold_page(limit=HOLDS_PER_PAGE, **search.filters())
    except ValueError:
        search.add_error(None, "That page link is out of date; start again from the first page.")
    except CoordinationUnavailable as exc:
        unavailable = exc.message
    if page is not None:
        holds = decorate_holds(page.rows, operate)
        if page.next_cursor:
            query = request.GET.copy()
            query["cursor"] = page.next_cursor
            next_url = f"?{query.urlencode()}#holds"
    first_query = request.GET.copy()
    first_query.pop("cursor", None)

    # bound only when the inspect form itself was submitted: a hold search is not an empty
    # inspection (which would show "This field is required." under it)
    form = InspectForm(request.GET if "key" in request.GET else None)
    inspected: dict[str, Any] | None = None
    inspect_error: str | None = None
    if form.is_bound and form.is_valid() and unavailable is None:
        try:
            inspected = inspect_report(
                form.cleaned_data["primitive"], form.cleaned_data["key"], form.cleaned_data["limit"]
            )
        except CoordinationUnavailable as exc:
            inspect_error = exc.message

    recent: list[dict[str, Any]] = []
    if unavailable is None:
        since = timezone.now() - timedelta(minutes=RECENT_MINUTES)
        try:
            for primitive, key in CoordinationEvent.objects.recent_keys(since, RECENT_KEYS):
                if primitive in live.PRIMITIVES:
                    recent.append(inspect_report(primitive, key))
        except CoordinationUnavailable as exc:
            unavailable = exc.message

    named_limits: list[dict[str, Any]] = []
    if unavailable is None:
        try:
            named_limits = [limit.as_dict() for limit in limits.named_limits()]
        except CoordinationUnavailable as exc:
            unavailable = exc.message

    context = coordination_context(
        model_admin,
        request,
        "Coordination",
        named_limits=named_limits,
        limits_url=url("limits"),
        holds=holds,
        totals=page.totals if page else {},
        total_holds=sum(page.totals.values()) if page else 0,
        matching=page.count if page else None,
        search=search,
        searching=any(v for k, v in search.filters().items() if k != "cursor"),
        primitive_links=_hold_links(request, "h_primitive", list(live.HOLDING_PRIMITIVES)),
        level_links=_hold_links(request, "h_level", list(live.LEVELS)),
        order_links=_hold_links(
            request, "h_order", list(HOLD_ORDER_LABELS), {"": "oldest first", **HOLD_ORDER_LABELS}
        ),
        ordered_by_key=bool(search.is_valid() and search.cleaned_data["q"]),
        next_url=next_url,
        first_url=f"?{first_query.urlencode()}#holds" if "cursor" in request.GET else None,
        per_page=HOLDS_PER_PAGE,
        step_holds=sum(1 for h in holds if h["level"] == "step"),
        reactor_holds=sum(1 for h in holds if h["level"] == "reactor"),
        semaphores=live.semaphore_occupancy(holds),
        form=form,
        inspected=inspected,
        inspect_error=inspect_error,
        recent=recent,
        recent_minutes=RECENT_MINUTES,
        unavailable=unavailable,
        parked_url=reverse("admin:reactor_app_parkedexecution_changelist"),
        events_url=reverse("admin:reactor_app_coordinationevent_changelist"),
        timeline_form=TimelineForm(initial={"minutes": 60}),
        timeline_action=url("timeline"),
        now=timezone.now(),
    )
    return TemplateResponse(request, "admin/reactor_app/coordination/dashboard.html", context)
