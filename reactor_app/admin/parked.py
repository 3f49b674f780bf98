"""The parked executions' admin: the step, primitive and key each parked execution waits on,
its attempts and next attempt, and the blocker (holder execution and step, since, TTL left)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from reactor_app.admin.display import (
    ReadOnlyMixin,
    execution_link,
    key_link,
    pretty_json,
    status_badge,
    step_or_reactor,
)
from reactor_app.datetimes import on_screen
from reactor_app.models import ParkedExecution
from reactor_app.operator.live import blocker_data


@admin.register(ParkedExecution)
class ParkedExecutionAdmin(ReadOnlyMixin, admin.ModelAdmin):
    """Executions waiting on contention, and exactly what they wait on."""

    list_display = (
        "execution_link",
        "reactor_name",
        "execution_status",
        "parked_on",
        "attempts",
        "next_attempt",
        "blocked_by",
    )
    list_filter = ("primitive", "step")
    search_fields = ("key", "execution__id", "execution__reactor")
    search_help_text = "coordination key, execution id or reactor"
    fields = (
        "execution_link",
        "reactor_name",
        "execution_status",
        "parked_step",
        "primitive",
        "key_timeline",
        "attempts",
        "next_attempt_at",
        "blocker_holder",
        "blocker_step",
        "blocker_since",
        "blocker_ttl_left",
        "blocker_json",
        "updated_at",
    )
    readonly_fields = fields
    ordering = ("-updated_at",)

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        # only executions still parked: a row outlives a resume until the engine clears it
        parked: Any = super().get_queryset(request)  # a ContentionStateQuerySet
        return parked.active()

    @admin.display(description="execution", ordering="execution")
    def execution_link(self, obj: ParkedExecution) -> SafeString | str:
        return execution_link(obj.execution_id, short=True)

    @admin.display(description="reactor")
    def reactor_name(self, obj: ParkedExecution) -> str:
        return obj.execution.reactor_name

    @admin.display(description="status")
    def execution_status(self, obj: ParkedExecution) -> SafeString:
        return status_badge(obj.execution.status)

    @admin.display(description="parked step", ordering="step")
    def parked_step(self, obj: ParkedExecution) -> SafeString:
        return step_or_reactor(obj.step)

    @admin.display(description="key", ordering="key")
    def key_timeline(self, obj: ParkedExecution) -> SafeString:
        return key_link(obj.key)

    def _blocker(self, obj: ParkedExecution) -> dict[str, Any]:
        return blocker_data(obj.blocker) or {}

    @admin.display(description="parked on", ordering="key")
    def parked_on(self, obj: ParkedExecution) -> SafeString:
        """Where it waits: the step (or reactor level), the primitive and the key."""
        return format_html(
            "{} · {} {}", step_or_reactor(obj.step), obj.primitive, key_link(obj.key)
        )

    @admin.display(description="next attempt", ordering="next_attempt_at")
    def next_attempt(self, obj: ParkedExecution) -> str:
        if obj.next_attempt_at is None:
            return "—"
        seconds = (obj.next_attempt_at - timezone.now()).total_seconds()
        when = on_screen(obj.next_attempt_at).strftime("%H:%M:%S")
        return f"{when} (in {seconds:.0f}s)" if seconds > 0 else f"{when} (due)"

    @admin.display(description="blocked by")
    def blocked_by(self, obj: ParkedExecution) -> SafeString | str:
        """The holder that refused it: execution (linked), step or reactor level, since, TTL."""
        blocker = self._blocker(obj)
        if not blocker:
            return "—"
        since = blocker.get("since")
        return format_html(
            "{} ({}) since {}, TTL left {}",
            execution_link(blocker["execution"], short=True)
            if blocker.get("execution")
            else (blocker.get("owner") or "?"),
            step_or_reactor(blocker.get("step")),
            on_screen(since).strftime("%H:%M:%S") if since else "?",
            self._ttl_left(obj),
        )

    @admin.display(description="blocked by")
    def blocker_holder(self, obj: ParkedExecution) -> SafeString | str:
        blocker = self._blocker(obj)
        if not blocker:
            return "—"
        if blocker.get("execution"):
            return execution_link(blocker["execution"])
        return blocker.get("owner") or "—"

    @admin.display(description="blocker step")
    def blocker_step(self, obj: ParkedExecution) -> SafeString | str:
        blocker = self._blocker(obj)
        return step_or_reactor(blocker.get("step")) if blocker else "—"

    @admin.display(description="held since")
    def blocker_since(self, obj: ParkedExecution) -> datetime | str:
        since = self._blocker(obj).get("since")
        return since or "—"

    def _ttl_left(self, obj: ParkedExecution) -> str:
        """The snapshot's TTL minus the time since the snapshot (the Coordination page has
        the live value)."""
        ttl = self._blocker(obj).get("ttl")
        if ttl is None:
            return "?"
        elapsed = (timezone.now() - obj.updated_at).total_seconds()
        return f"{max(ttl - elapsed, 0):.1f}s"

    @admin.display(description="TTL left")
    def blocker_ttl_left(self, obj: ParkedExecution) -> str:
        ttl = self._blocker(obj).get("ttl")
        if ttl is None:
            return "—"
        return f"{self._ttl_left(obj)} (was {ttl:.1f}s when it parked)"

    @admin.display(description="blocker snapshot")
    def blocker_json(self, obj: ParkedExecution) -> SafeString:
        return pretty_json(obj.blocker)
