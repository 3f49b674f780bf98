"""The admin: read-only runtime records, parked executions with why, and the Coordination page.

* **Executions** — status (a park is shown as waiting, never as a failure), inputs, result,
  error, rollback failures, with step runs and coordination events inline; filtered by status,
  reactor and date; searchable by id and by coordination key.
* **Parked executions** — the step, primitive and key each parked execution waits on, its
  attempts and next attempt, and the blocker (holder execution and step, since, TTL left).
* **Coordination events** — the history of every hold.
* **Coordination** — live Redis state and the operator actions (``admin_views``).

Runtime records are written by the engine only, so every ModelAdmin here is read-only. The one
action on executions, **retry from a step**, creates a new execution (``retry_admin``).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from reactor_app import admin_cancel, admin_views, retry_admin
from reactor_app.models import (
    Coordination,
    CoordinationEvent,
    Execution,
    ParkedExecution,
    StepRun,
)
from reactor_app.operator.live import blocker_data
from reactor_app.serialization import readable
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
}
STATUS_HINTS = {
    ExecutionStatus.PARKED: "waiting on contention; will resume (not a failure)",
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
        reverse("admin:reactor_app_execution_change", args=[full]),
        full,
        f"{full[:8]}…" if short else full,
    )


def key_link(key: str) -> SafeString:
    return format_html(
        '<a href="{}" title="timeline">{}</a>', admin_views.url("timeline", key=key), key
    )


def step_or_reactor(step: str | None) -> SafeString:
    if step:
        return format_html("<code>{}</code>", step)
    return format_html('<em title="{}">reactor</em>', "a reactor-level hold or park")


class ReadOnlyMixin:
    """Runtime records are written by the engine only."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class StepRunInline(ReadOnlyMixin, admin.TabularInline):
    model = StepRun
    extra = 0
    fields = ("step", "kind", "attempt", "status", "started_at", "finished_at", "error")
    readonly_fields = fields
    ordering = ("started_at", "id")


class CoordinationEventInline(ReadOnlyMixin, admin.TabularInline):
    model = CoordinationEvent
    extra = 0
    fields = ("at", "kind", "primitive", "key_timeline", "owning_step", "owner", "token", "detail")
    readonly_fields = fields
    ordering = ("at", "id")
    verbose_name_plural = "coordination events"

    @admin.display(description="key")
    def key_timeline(self, obj: CoordinationEvent) -> SafeString:
        return key_link(obj.key)

    @admin.display(description="step")
    def owning_step(self, obj: CoordinationEvent) -> SafeString:
        return step_or_reactor(obj.step)


@admin.register(Execution)
class ExecutionAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = (
        "id",
        "reactor_name",
        "status_badge",
        "current_step",
        "created_at",
        "finished_at",
    )
    list_filter = ("status", "reactor", "created_at")
    search_fields = ("id", "reactor", "correlation_id")
    search_help_text = (
        "execution id (or part of it), reactor, correlation id, or a coordination key"
    )
    date_hierarchy = "created_at"
    fields = (
        "id",
        "reactor",
        "status_badge",
        "current_step",
        "parked_on",
        "inputs_json",
        "result_json",
        "error_json",
        "rollback_failures_json",
        "root",
        "parent",
        "retry_links",
        "correlation_id",
        "created_at",
        "started_at",
        "finished_at",
        "heartbeat_at",
        "context_json",
    )
    readonly_fields = fields
    inlines = [StepRunInline, CoordinationEventInline]
    # operators' writes on executions: cancelling (admin_cancel) and retrying (retry_admin)
    actions = [admin_cancel.cancel_selected, "retry_failed"]

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return admin_cancel.can_cancel(request)

    def _cancel_urls(self) -> list[URLPattern]:
        cancel = path(
            "<path:object_id>/cancel/",
            self.admin_site.admin_view(
                lambda request, object_id: admin_cancel.cancel_page(self, request, object_id)
            ),
            name="reactor_app_execution_cancel",
        )
        return [cancel]

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        execution = self.get_object(request, object_id)
        context = {**(extra_context or {}), **admin_cancel.page_context(request, execution)}
        return super().change_view(request, object_id, form_url, extra_context=context)

    @admin.display(description="reactor")
    def reactor_name(self, obj: Execution) -> str:
        return obj.reactor_name

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj: Execution) -> SafeString:
        return status_badge(obj.status)

    @admin.display(description="parked on")
    def parked_on(self, obj: Execution) -> SafeString | str:
        if obj.status != ExecutionStatus.PARKED:
            return "—"
        rows = list(obj.contention.all())
        if not rows:
            return "—"
        return format_html(
            '<a href="{}?execution__id__exact={}">{}</a>',
            reverse("admin:reactor_app_parkedexecution_changelist"),
            obj.pk,
            "; ".join(f"{r.primitive} {r.key} ({r.step or 'reactor'})" for r in rows),
        )

    @admin.display(description="inputs")
    def inputs_json(self, obj: Execution) -> SafeString:
        return pretty_json(readable(obj.inputs))

    @admin.display(description="result")
    def result_json(self, obj: Execution) -> SafeString:
        return pretty_json(readable(obj.result))

    @admin.display(description="error")
    def error_json(self, obj: Execution) -> SafeString:
        return pretty_json(obj.error)

    @admin.display(description="rollback failures")
    def rollback_failures_json(self, obj: Execution) -> SafeString:
        return pretty_json(obj.rollback_failures)

    @admin.display(description="engine state")
    def context_json(self, obj: Execution) -> SafeString:
        return pretty_json(readable(obj.context))

    # -- retry from a step (reactor_app.engine.retry) --------------------------------------

    def has_retry_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # re-running a saga changes the world: the operator permission, as for force-release
        return admin_views.can_operate(request)

    @admin.display(description="retry")
    def retry_links(self, obj: Execution) -> SafeString | str:
        """The retry this execution had or is (links), and the retry button when it can have
        one; the button is shown to everyone and the page checks the permission."""
        parts: list[SafeString] = []
        if obj.retry_of_id:
            parts.append(format_html("retry of {}", execution_link(obj.retry_of_id, short=True)))
        for retried in obj.retries.all():
            parts.append(format_html("retried as {}", execution_link(retried.pk, short=True)))
        if retry_admin.retryable(obj):
            parts.append(
                format_html(
                    '<a class="button" id="retry-execution" href="{}">Retry from a step…</a>',
                    reverse("admin:reactor_app_execution_retry", args=[obj.pk]),
                )
            )
        if not parts:
            return "—"
        return format_html_join(" · ", "{}", ((part,) for part in parts))

    @admin.action(
        description="Retry the selected failed executions from their failed step",
        permissions=["retry"],
    )
    def retry_failed(self, request: HttpRequest, queryset: QuerySet) -> None:
        retry_admin.retry_selected(self, request, queryset)

    def get_urls(self) -> list[URLPattern]:
        retry = path(
            "<path:object_id>/retry/",
            self.admin_site.admin_view(
                lambda request, object_id: retry_admin.retry_page(self, request, object_id)
            ),
            name="reactor_app_execution_retry",
        )
        return [retry, *self._cancel_urls(), *super().get_urls()]

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        results, may_have_duplicates = super().get_search_results(request, queryset, search_term)
        term = search_term.strip()
        if term:
            # a coordination key matches executions that contended on it or have events for it
            by_key = queryset.filter(pk__in=Execution.objects.search_key(term).values("pk"))
            results = results | by_key
        return results, may_have_duplicates


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
        when = timezone.localtime(obj.next_attempt_at).strftime("%H:%M:%S")
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
            timezone.localtime(since).strftime("%H:%M:%S") if since else "?",
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


@admin.register(CoordinationEvent)
class CoordinationEventAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = (
        "at",
        "kind",
        "primitive",
        "key_timeline",
        "owning_step",
        "execution_link",
        "owner",
        "token",
    )
    list_filter = ("kind", "primitive", "at")
    search_fields = ("key", "owner", "step", "reactor")
    search_help_text = "coordination key, owner, step or reactor"
    date_hierarchy = "at"
    list_select_related = ("execution",)
    readonly_fields = (
        "at",
        "kind",
        "primitive",
        "key",
        "step",
        "reactor",
        "execution",
        "owner",
        "token",
        "detail",
    )

    @admin.display(description="key", ordering="key")
    def key_timeline(self, obj: CoordinationEvent) -> SafeString:
        return key_link(obj.key)

    @admin.display(description="step", ordering="step")
    def owning_step(self, obj: CoordinationEvent) -> SafeString:
        return step_or_reactor(obj.step)

    @admin.display(description="execution", ordering="execution")
    def execution_link(self, obj: CoordinationEvent) -> SafeString | str:
        return execution_link(obj.execution_id, short=True)


@admin.register(Coordination)
class CoordinationAdmin(ReadOnlyMixin, admin.ModelAdmin):
    """Not a table: the entry point of the live Coordination page and its actions."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(
            request.user.is_active and request.user.is_staff
        ) and super().has_view_permission(request, obj)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return admin_views.coordination_page(self, request)

    def get_urls(self) -> list[URLPattern]:
        def view(function: Any, name: str) -> URLPattern:
            def wrapper(request: HttpRequest) -> HttpResponse:
                if not self.has_view_permission(request):
                    raise PermissionDenied
                return function(self, request)

            route = name.replace("_", "-")
            return path(
                f"{route}/",
                self.admin_site.admin_view(wrapper),
                name=f"reactor_app_coordination_{name}",
            )

        return [
            view(admin_views.timeline_page, "timeline"),
            view(admin_views.force_release_page, "force_release"),
            view(admin_views.ordered_skip_page, "ordered_skip"),
            view(admin_views.ordered_reset_page, "ordered_reset"),
            path(
                "",
                self.admin_site.admin_view(self.changelist_view),
                name="reactor_app_coordination_changelist",
            ),
        ]
