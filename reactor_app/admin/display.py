"""How the admin shows runtime records: status badges, JSON, links to executions and key
timelines, the step-or-reactor level, and the read-only permissions every ModelAdmin shares."""

from __future__ import annotations

import json
from typing import Any

from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString

from reactor_app.admin.links import execution_url, url
from reactor_app.status import ExecutionStatus

#: badge colours per execution status; parked is amber (waiting), never failure red
STATUS_COLOURS = {
    ExecutionStatus.PENDING: "#7f8c8d",
    ExecutionStatus.RUNNING: "#2e86c1",
    ExecutionStatus.PARKED: "#d68910",
    ExecutionStatus.INTERRUPTED: "#7d3c98",
    ExecutionStatus.SUCCEEDED: "#1e8449",
    ExecutionStatus.FAILED: "#c0392b",
    ExecutionStatus.HALTED: "#566573",
    ExecutionStatus.CANCELLED: "#7b7d7d",
    ExecutionStatus.SUPERSEDED: "#a6acaf",
}
STATUS_HINTS = {
    ExecutionStatus.PARKED: "waiting on contention; will resume (not a failure)",
    ExecutionStatus.SUPERSEDED: "replaced by a later start of its debounce burst; never ran",
}


def status_badge(status: str) -> SafeString:
    colour = STATUS_COLOURS.get(status, "#555")  # type: ignore[call-overload]
    hint = STATUS_HINTS.get(status, "")  # type: ignore[call-overload]
    return format_html(
        '<span class="reactor-status reactor-status-{}" title="{}" style="background:{};'
        'color:#fff;padding:1px 7px;border-radius:9px;font-size:11px">{}</span>',
        status,
        hint,
        colour,
        status,
    )


def pretty_json(value: Any) -> SafeString:
    if value in (None, "", [], {}):
        return format_html('<span style="color:#888">{}</span>', "—")
    return format_html(
        '<pre style="margin:0;white-space:pre-wrap">{}</pre>',
        json.dumps(value, indent=2, sort_keys=True, default=str),
    )


def execution_link(execution_id: Any, *, short: bool = False) -> SafeString | str:
    """A link to the execution's admin page; ``short`` shows the first 8 characters of the id
    (the full id is in the title and the link)."""
    if not execution_id:
        return "—"
    full = str(execution_id)
    return format_html(
        '<a href="{}" title="{}">{}</a>',
        execution_url(full),
        full,
        f"{full[:8]}…" if short else full,
    )


def key_link(key: str) -> SafeString:
    return format_html('<a href="{}" title="timeline">{}</a>', url("timeline", key=key), key)


def step_or_reactor(step: str | None) -> SafeString:
    if step:
        return format_html("<code>{}</code>", step)
    return format_html('<em title="{}">reactor</em>', "a reactor-level hold or park")


class GuardedChangeList(ChangeList):
    """A changelist that answers a filter value the database or Django cannot take with the
    admin's own "bad filter" page (a redirect to ``?e=1``), never a server error: a NUL
    character (PostgreSQL text cannot hold one; the search box already refuses it) or a date
    drill-down past the calendar (``created_at__year=9999``: the end of the period overflows
    where Django computes it)."""

    def get_filters(self, request: HttpRequest) -> Any:
        for name, value in self.get_filters_params().items():
            values = value if isinstance(value, list) else [value]
            if any("\x00" in str(item) for item in values):
                raise IncorrectLookupParameters(f"{name}: a NUL character")
        try:
            return super().get_filters(request)
        except (ValueError, OverflowError) as exc:
            raise IncorrectLookupParameters(exc) from exc


class ReadOnlyMixin:
    """Runtime records are written by the engine only, and listed from whatever query string
    the browser sends (``GuardedChangeList``)."""

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return GuardedChangeList

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
