"""The key timeline page (``coordination/timeline/?key=...&minutes=60``): the key's SVG
timeline (``reactor_app.timeline``), its events in the period, and who holds it now."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.safestring import mark_safe

from reactor_app import timeline
from reactor_app.admin.forms import MAX_TIMELINE_MINUTES, TimelineForm
from reactor_app.admin.pages import coordination_context, decorate_holds, live_hold_limit
from reactor_app.admin.permissions import can_operate
from reactor_app.exceptions import CoordinationUnavailable
from reactor_app.models import CoordinationEvent
from reactor_app.operator import live

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin


def timeline_page(model_admin: ModelAdmin, request: HttpRequest) -> HttpResponse:
    """The SVG timeline of one key, its events in the period, and who holds it now."""
    data = request.GET.copy()
    form = TimelineForm(data if "key" in data else None)
    context: dict[str, Any] = {"form": form}
    if form.is_bound and form.is_valid():
        key, minutes = form.cleaned_data["key"], form.cleaned_data["minutes"]
        try:
            held = live.hold_page(key=key, limit=live_hold_limit()).rows
            holding = decorate_holds(held, can_operate(request))
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
        coordination_context(model_admin, request, title, **context),
    )
