"""The executions' admin: status (a park is shown as waiting, never as a failure), inputs,
result, error, rollback failures, with step runs and coordination events inline; filtered by
status, reactor and date; searchable by id and by coordination key.

Read-only, as every runtime record: the operators' writes on an execution are cancelling it
(``cancel``) and retrying it from a step (``retry``), each with its own pages.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from reactor_app.admin import cancel as admin_cancel
from reactor_app.admin import retry as retry_admin
from reactor_app.admin.display import (
    ReadOnlyMixin,
    execution_link,
    key_link,
    pretty_json,
    status_badge,
    step_or_reactor,
)
from reactor_app.admin.permissions import can_operate
from reactor_app.engine.progress import stored_context
from reactor_app.models import CoordinationEvent, Execution, StepRun
from reactor_app.serialization import readable
from reactor_app.status import ExecutionStatus

#: rows of each inline (step runs, coordination events) and entries of each list or map in the
#: JSON fields an execution's page renders: a 10,000-element map's page stays a page
PAGE_ROWS = 100


class FirstRowsInline(admin.TabularInline):
    """An inline that renders the execution's first ``PAGE_ROWS`` rows, not all of them
    (``history`` on the page says how many there are)."""

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        rows = super().get_queryset(request)
        match = request.resolver_match
        object_id = match.kwargs.get("object_id") if match else None
        if object_id is None:
            return rows
        try:
            first = rows.filter(execution_id=object_id).order_by(*(self.ordering or ("id",)))
            ids = list(first.values_list("pk", flat=True)[:PAGE_ROWS])
        except ValidationError:  # not an execution id: the page itself answers it
            return rows.none()
        return rows.filter(pk__in=ids)


class StepRunInline(ReadOnlyMixin, FirstRowsInline):
    model = StepRun
    extra = 0
    fields = ("step", "kind", "attempt", "status", "started_at", "finished_at", "error")
    readonly_fields = fields
    ordering = ("started_at", "id")


class CoordinationEventInline(ReadOnlyMixin, FirstRowsInline):
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
        "history",
        "context_json",
    )
    readonly_fields = fields
    inlines = [StepRunInline, CoordinationEventInline]
    # operators' writes on executions: cancelling (``cancel``) and retrying (``retry``)
    actions = [admin_cancel.cancel_selected, "retry_failed"]

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return admin_cancel.can_cancel(request)

    def response_action(
        self, request: HttpRequest, queryset: QuerySet[Execution], *args: Any, **kwargs: Any
    ) -> HttpResponse | None:
        """An action on a selection that is not execution ids (a hand-made POST) is refused
        with a message: Django would filter the executions by it and fail on the first value
        that is not a UUID."""
        for value in request.POST.getlist(ACTION_CHECKBOX_NAME):
            try:
                Execution._meta.pk.to_python(value)
            except ValidationError:
                self.message_user(request, f"not an execution: {value!r}", messages.ERROR)
                return HttpResponseRedirect(request.get_full_path())
        return super().response_action(request, queryset, *args, **kwargs)

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
        return pretty_json(trimmed(readable(obj.inputs)))

    @admin.display(description="result")
    def result_json(self, obj: Execution) -> SafeString:
        return pretty_json(trimmed(readable(obj.result)))

    @admin.display(description="history")
    def history(self, obj: Execution) -> str:
        steps, events = obj.step_runs.count(), obj.coordination_events.count()
        shown = f" (the first {PAGE_ROWS} of each below)" if max(steps, events) > PAGE_ROWS else ""
        return f"{steps} step runs, {events} coordination events{shown}"

    @admin.display(description="error")
    def error_json(self, obj: Execution) -> SafeString:
        return pretty_json(obj.error)

    @admin.display(description="rollback failures")
    def rollback_failures_json(self, obj: Execution) -> SafeString:
        return pretty_json(obj.rollback_failures)

    @admin.display(description="engine state")
    def context_json(self, obj: Execution) -> SafeString:
        # the context with its progress rows applied (results, rollback log): the whole state
        return pretty_json(trimmed(readable(stored_context(obj))))

    # -- retry from a step (reactor_app.engine.retry) --------------------------------------

    def has_retry_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # re-running a saga changes the world: the operator permission, as for force-release
        return can_operate(request)

    @admin.display(description="retry")
    def retry_links(self, obj: Execution) -> SafeString | str:
        """The retry this execution had or is (links), and the retry button when it can have
        one; the button is shown to everyone and the page checks the permission."""
        parts: list[SafeString] = []
        if obj.retry_of_id:
            parts.append(format_html("retry of {}", execution_link(obj.retry_of_id, short=True)))
        if obj.superseded_by_id:
            parts.append(
                format_html("superseded by {}", execution_link(obj.superseded_by_id, short=True))
            )
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
        description="Retry the selected failed executions (confirm what is reused first)",
        permissions=["retry"],
    )
    def retry_failed(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        return retry_admin.retry_selected(self, request, queryset)

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


def trimmed(value: Any, limit: int = PAGE_ROWS) -> Any:
    """``value`` with every list and map cut to its first ``limit`` entries, a last entry
    saying how many more there are: the results of a 10,000-element map are not rendered."""
    if isinstance(value, list):
        kept = [trimmed(item, limit) for item in value[:limit]]
        if len(value) > limit:
            kept.append(f"… {len(value) - limit} more")
        return kept
    if isinstance(value, dict):
        items = list(value.items())
        kept_map = {key: trimmed(item, limit) for key, item in items[:limit]}
        if len(items) > limit:
            kept_map["…"] = f"{len(items) - limit} more"
        return kept_map
    return value
