"""The ``Coordination`` proxy's admin: not a table, the entry point of the live Coordination
page, the key timeline and the operator actions, whose URLs it hangs under its own."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path

from reactor_app.admin.dashboard import coordination_page
from reactor_app.admin.display import ReadOnlyMixin
from reactor_app.admin.key_timeline import timeline_page
from reactor_app.admin.limits import limits_page
from reactor_app.admin.operator_actions import (
    force_release_page,
    ordered_reset_page,
    ordered_skip_page,
)
from reactor_app.models import Coordination


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
        return coordination_page(self, request)

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
            view(timeline_page, "timeline"),
            view(limits_page, "limits"),
            view(force_release_page, "force_release"),
            view(ordered_skip_page, "ordered_skip"),
            view(ordered_reset_page, "ordered_reset"),
            path(
                "",
                self.admin_site.admin_view(self.changelist_view),
                name="reactor_app_coordination_changelist",
            ),
        ]
