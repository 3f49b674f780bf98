"""Custom admin pages: the Coordination dashboard, the per-key timeline and the staff actions.

They hang off the ``Coordination`` proxy's ModelAdmin (see ``admin.py``), so they appear in the
admin index, use the admin's login, CSS and breadcrumbs, and are reached at

* ``coordination/`` — live holds from the live-holds index, 50 a page (step-level beside
  reactor-level), searchable by key prefix, step and reactor, filtered by primitive and level,
  with totals per primitive; semaphore occupancy of the listed holds; and the state of keys
  asked about or recently seen (rate-limit windows, period marks, ordered-lock
  head/next/first-failed);
* ``coordination/timeline/?key=...&minutes=60`` — the key's SVG timeline (``timeline``);
* ``coordination/force-release/``, ``coordination/ordered-skip/``, ``coordination/ordered-reset/``
  — GET shows what would change and asks to confirm; POST does it and records an audit event.

Reading needs the admin view permission on Coordination; acting needs
``reactor_app.force_release`` as well (superusers have both).
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode
from django.utils.safestring import mark_safe

from reactor_app import timeline
from reactor_app.exceptions import CoordinationUnavailable
from reactor_app.models import CoordinationEvent, Execution
from reactor_app.operator import live, operations

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

#: the permission every state-changing operator action needs
OPERATE_PERMISSION = "reactor_app.force_release"
#: how far back "recently seen keys" look, and how many of them are inspected
RECENT_MINUTES = 60
RECENT_KEYS = 30
#: the longest timeline period offered (one week)
MAX_TIMELINE_MINUTES = 7 * 24 * 60
#: live holds per page of the Coordination page (read from the live-holds index)
HOLDS_PER_PAGE = 50


def can_operate(request: HttpRequest) -> bool:
    user = request.user
    return bool(user.is_active and user.is_staff and user.has_perm(OPERATE_PERMISSION))


def url(name: str, **params: Any) -> str:
    """An admin URL of this app's coordination pages with a query string."""
    target = reverse(f"admin:reactor_app_coordination_{name}")
    query = {k: v for k, v in params.items() if v not in (None, "")}
    return f"{target}?{urlencode(query)}" if query else target


def execution_url(execution_id: str | None) -> str | None:
    if not execution_id:
        return None
    return reverse("admin:reactor_app_execution_change", args=[execution_id])


# -- forms -----------------------------------------------------------------------------------


class InspectForm(forms.Form):
    """ "What is the state of this key?" — any primitive, any key."""

    primitive = forms.ChoiceField(choices=[(p, p) for p in live.PRIMITIVES], initial="lock")
    key = forms.CharField(max_length=512)
    limit = forms.IntegerField(
        required=False, min_value=1, help_text="semaphore limit, to show free slots"
    )


#: the Coordination page's orders of live holds besides the default (oldest first)
HOLD_ORDER_LABELS = {
    "-acquired": "newest first",
    "ttl": "least time left",
    "-ttl": "most time left",
}


class HoldSearchForm(forms.Form):
    """Which live holds the Coordination page lists (its own parameter names, so that the
    inspect form's ``primitive``/``key`` on the same page never filter the holds)."""

    q = forms.CharField(
        required=False, max_length=512, label="Key starts with", help_text="e.g. acct:"
    )
    h_step = forms.CharField(required=False, max_length=255, label="Step")
    h_reactor = forms.CharField(
        required=False, max_length=255, label="Reactor", help_text="path or class name"
    )
    h_primitive = forms.ChoiceField(
        required=False,
        label="Primitive",
        choices=[("", "all"), *[(p, p) for p in live.HOLDING_PRIMITIVES]],
    )
    h_level = forms.ChoiceField(
        required=False, label="Level", choices=[("", "all"), *[(lv, lv) for lv in live.LEVELS]]
    )
    h_order = forms.ChoiceField(
        required=False,
        label="Order",
        choices=[("", "oldest first"), *[(o, label) for o, label in HOLD_ORDER_LABELS.items()]],
        help_text="not when searching by key",
    )
    cursor = forms.CharField(required=False, max_length=2048, widget=forms.HiddenInput)

    def filters(self) -> dict[str, Any]:
        """``live.hold_page`` arguments (empty when the form is invalid)."""
        if not self.is_valid():
            return {}
        data = self.cleaned_data
        return {
            "key_prefix": data["q"] or None,
            "step": data["h_step"] or None,
            "reactor": data["h_reactor"] or None,
            "primitive": data["h_primitive"] or None,
            "level": data["h_level"] or None,
            # a key search lists by key: the order applies to the other listings
            "ordering": (data["h_order"] or None) if not data["q"] else None,
            "cursor": data["cursor"] or None,
        }


def live_hold_limit() -> int:
    """How many holds of one key the pages show (a semaphore can have many holders)."""
    return 200


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


class TimelineForm(forms.Form):
    key = forms.CharField(max_length=512)
    minutes = forms.IntegerField(
        min_value=1,
        max_value=MAX_TIMELINE_MINUTES,
        required=False,
        help_text="blank: zoom to the key's events",
    )


class ForceReleaseForm(forms.Form):
    primitive = forms.ChoiceField(choices=[(p, p) for p in live.HOLDING_PRIMITIVES])
    key = forms.CharField(max_length=512)
    owner = forms.CharField(max_length=255, required=False)


class OrderedKeyForm(forms.Form):
    key = forms.CharField(max_length=512)


# -- helpers ---------------------------------------------------------------------------------


def _context(model_admin: ModelAdmin, request: HttpRequest, title: str, **extra: Any) -> dict:
    return {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "title": title,
        "can_operate": can_operate(request),
        "coordination_url": url("changelist"),
        **extra,
    }


def _decorate_holds(holds: list[dict[str, Any]], operate: bool) -> list[dict[str, Any]]:
    """Add the links a row needs (execution page, timeline, force release) and its status."""
    statuses = Execution.objects.statuses_of(h["execution"] for h in holds)
    for hold in holds:
        hold["execution_status"] = statuses.get(hold["execution"] or "")
        hold["execution_url"] = (
            execution_url(hold["execution"]) if hold["execution_status"] else None
        )
        hold["timeline_url"] = url("timeline", key=hold["key"])
        if operate:
            hold["force_release_url"] = url(
                "force_release", primitive=hold["primitive"], key=hold["key"], owner=hold["owner"]
            )
    return holds


def _summary(report: dict[str, Any]) -> str:
    """One line describing an ``inspect_key`` report (for the recent-keys table)."""
    primitive = report["primitive"]
    if primitive == "lock":
        lock = report["lock"]
        if not lock["held"]:
            return "free"
        where = f"step {lock['step']}" if lock["step"] else "reactor level"
        return f"held by {lock['execution'] or lock['owner']} ({where}), x{lock['count']}"
    if primitive == "semaphore":
        return f"{report['semaphore']['held']} slot(s) held"
    if primitive == "rate_limit":
        return ", ".join(
            f"{w['count']}{'/' + str(w['limit']) if w['limit'] else ''} per {w['window']}"
            for w in report["windows"]
        )
    if primitive == "period":
        parts = [f"{m['every']} marked by {m['marked_by']}" for m in report["marked"]]
        parts += [
            f"{m['every']} in flight ({m['in_flight']['execution'] or m['in_flight']['owner']})"
            for m in report["in_flight"]
        ]
        return ", ".join(parts) or "no current bucket marked or in flight"
    ordered = report["ordered"]
    return (
        f"head {ordered['head'] or '-'}, next {ordered['next']}, "
        f"last completed {ordered['last_completed']}, first failed "
        f"{ordered['first_failed'] or '-'}, {len(ordered['positions'])} waiting"
    )


def _inspect(primitive: str, key: str, limit: int | None = None) -> dict[str, Any]:
    report = live.inspect_key(primitive, key, limit=limit)
    report["summary"] = _summary(report)
    report["timeline_url"] = url("timeline", key=key)
    for holder in report.get("semaphore", {}).get("holders", []):
        holder["execution_url"] = execution_url(holder.get("execution"))
    if primitive == "lock" and report["lock"]["held"]:
        report["lock"]["execution_url"] = execution_url(report["lock"]["execution"])
    if primitive == "ordered_lock":
        for position in report["ordered"]["positions"]:
            position["execution_url"] = execution_url(position.get("execution"))
        report["skip_url"] = url("ordered_skip", key=key)
        report["reset_url"] = url("ordered_reset", key=key)
    return report


# -- pages -----------------------------------------------------------------------------------


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
        holds = _decorate_holds(page.rows, operate)
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
            inspected = _inspect(
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
                    recent.append(_inspect(primitive, key))
        except CoordinationUnavailable as exc:
            unavailable = exc.message

    context = _context(
        model_admin,
        request,
        "Coordination",
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


def timeline_page(model_admin: ModelAdmin, request: HttpRequest) -> HttpResponse:
    """The SVG timeline of one key, its events in the period, and who holds it now."""
    data = request.GET.copy()
    form = TimelineForm(data if "key" in data else None)
    context: dict[str, Any] = {"form": form}
    if form.is_bound and form.is_valid():
        key, minutes = form.cleaned_data["key"], form.cleaned_data["minutes"]
        try:
            held = live.hold_page(key=key, limit=live_hold_limit()).rows
            holding = _decorate_holds(held, can_operate(request))
            unavailable = None
        except CoordinationUnavailable as exc:
            holding, unavailable = [], exc.message
        zoom = None
        if minutes is None:
            # Opened from a link: zoom to the key's own events (the period links widen it).
            zoom = timeline.zoomed_range(
                key, within_minutes=MAX_TIMELINE_MINUTES, held_now=bool(holding)
            )
        if zoom is not None:
            drawn = timeline.for_range(key, *zoom)
        else:
            drawn = timeline.for_key(key, minutes or 60)
        events = CoordinationEvent.objects.timeline(key, drawn.start, drawn.end).select_related(
            "execution"
        )
        context.update(
            key=key,
            minutes=minutes,
            zoomed=zoom is not None,
            timeline=drawn,
            # render_svg escapes every piece of text it places in the markup
            svg=mark_safe(timeline.render_svg(drawn)),
            events=list(events.reverse()[:200]),
            holding=holding,
            unavailable=unavailable,
            periods=[5, 15, 60, 360, 1440],
        )
    title = f"Timeline of {context['key']}" if "key" in context else "Key timeline"
    return TemplateResponse(
        request,
        "admin/reactor_app/coordination/timeline.html",
        _context(model_admin, request, title, **context),
    )


# -- staff actions ---------------------------------------------------------------------------


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
    context = _context(
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


def _require_operator(request: HttpRequest) -> None:
    if not can_operate(request):
        raise PermissionDenied(
            f"changing live coordination state needs the {OPERATE_PERMISSION!r} permission"
        )


def _operator_name(request: HttpRequest) -> str:
    return request.user.get_username()


def _back() -> HttpResponseRedirect:
    return HttpResponseRedirect(url("changelist") + "#holds")


def force_release_page(model_admin: ModelAdmin, request: HttpRequest) -> HttpResponse:
    """GET: what would be released (confirm). POST: release it and record ``forced_release``."""
    _require_operator(request)
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
    return _confirm(
        model_admin,
        request,
        title=f"Force-release {primitive} {key}",
        action=url("force_release"),
        form=form,
        state={"holders": _decorate_holds(holders, operate=False)},
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
    _require_operator(request)
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
        state = _inspect("ordered_lock", key)
    except CoordinationUnavailable as exc:
        messages.error(request, exc.message)
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
