"""Read-only admin for runtime records: executions with their step runs inline."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from reactor_app.models import Execution, StepRun


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


@admin.register(Execution)
class ExecutionAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ("id", "reactor_name", "status", "current_step", "created_at", "finished_at")
    list_filter = ("status", "reactor", "created_at")
    search_fields = ("id", "reactor", "correlation_id")
    date_hierarchy = "created_at"
    readonly_fields = (
        "id", "reactor", "status", "inputs", "result", "error", "rollback_failures",
        "current_step", "root", "parent", "correlation_id", "context", "created_at",
        "started_at", "finished_at", "heartbeat_at",
    )
    inlines = [StepRunInline]

    @admin.display(description="reactor")
    def reactor_name(self, obj: Execution) -> str:
        return obj.reactor_name
