"""The coordination events' admin: the history of every hold, searchable by key, owner, step
and reactor."""

from __future__ import annotations

from django.contrib import admin
from django.utils.safestring import SafeString

from reactor_app.admin.display import ReadOnlyMixin, execution_link, key_link, step_or_reactor
from reactor_app.models import CoordinationEvent


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
