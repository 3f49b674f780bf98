"""Admin of the demo shop: accounts, and the step-body activity the showcase reads."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from demo_project.shop.models import Account, Activity


@admin.register(Account)
class AccountAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("number", "balance", "fencing_token")
    search_fields = ("number",)


@admin.register(Activity)
class ActivityAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Read-only: rows are written by step bodies, as evidence of when they ran."""

    list_display = (
        "started_at",
        "finished_at",
        "step",
        "kind",
        "account_number",
        "execution_id",
        "fencing_token",
        "pid",
    )
    list_filter = ("step", "kind")
    search_fields = ("=account_number", "=execution_id")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
