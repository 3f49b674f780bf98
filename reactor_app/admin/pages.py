"""What the Coordination pages share: the admin's page context, live holds decorated with
their links, and a key's inspected state with its one-line summary."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.http import HttpRequest

from reactor_app.admin.links import execution_url, url
from reactor_app.admin.permissions import can_operate
from reactor_app.coordination import ordered_lock, primitives
from reactor_app.models import Execution
from reactor_app.operator import live

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin


def live_hold_limit() -> int:
    """How many holds of one key the pages show (a semaphore can have many holders)."""
    return 200


def coordination_context(
    model_admin: ModelAdmin, request: HttpRequest, title: str, **extra: Any
) -> dict:
    return {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "title": title,
        "can_operate": can_operate(request),
        "coordination_url": url("changelist"),
        **extra,
    }


def decorate_holds(holds: list[dict[str, Any]], operate: bool) -> list[dict[str, Any]]:
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


def report_summary(report: dict[str, Any]) -> str:
    """One line describing an ``inspect_key`` report (for the recent-keys table)."""
    return primitives.get(report["primitive"]).summary(report)


def inspect_report(primitive: str, key: str, limit: int | None = None) -> dict[str, Any]:
    report = live.inspect_key(primitive, key, limit=limit)
    report["summary"] = report_summary(report)
    report["timeline_url"] = url("timeline", key=key)
    for entry in primitives.get(primitive).attributed(report):
        entry["execution_url"] = execution_url(entry.get("execution"))
    if primitive == ordered_lock.PRIMITIVE:  # the verbs only a line has
        report["skip_url"] = url("ordered_skip", key=key)
        report["reset_url"] = url("ordered_reset", key=key)
    return report
