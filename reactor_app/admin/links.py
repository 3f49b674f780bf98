"""The admin URLs the pages link to: the Coordination pages (with a query) and an execution."""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from django.utils.http import urlencode


def url(name: str, **params: Any) -> str:
    """An admin URL of this app's coordination pages with a query string."""
    target = reverse(f"admin:reactor_app_coordination_{name}")
    query = {k: v for k, v in params.items() if v not in (None, "")}
    return f"{target}?{urlencode(query)}" if query else target


def execution_url(execution_id: str | None) -> str | None:
    if not execution_id:
        return None
    return reverse("admin:reactor_app_execution_change", args=[execution_id])
