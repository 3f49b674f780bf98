"""Every page an operator opens: the app's admin pages and the API's listings.

``operator_pages(execution_id)`` lists them for tests that check each answers — under a
setting that changes how they read (``USE_TZ``, a database router): the app's admin index,
the changelist of each of its admin models and the change page of a row of each, the limits
page, every API listing and an execution's detail and step runs.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.urls import reverse

API_LISTINGS = ("executions", "holds", "events", "contention", "limits")


def operator_pages(execution_id: Any) -> list[str]:
    pages = [reverse("admin:app_list", args=["reactor_app"])]
    for model in admin.site._registry:
        if model._meta.app_label != "reactor_app":
            continue
        name = f"admin:reactor_app_{model._meta.model_name}"
        pages.append(reverse(f"{name}_changelist"))
        row = model._default_manager.order_by("pk").first()
        if row is not None and not model._meta.proxy:
            pages.append(reverse(f"{name}_change", args=[row.pk]))
    pages.append(reverse("admin:reactor_app_coordination_limits"))
    pages += [f"/api/reactor/{name}/" for name in API_LISTINGS]
    pages += [
        f"/api/reactor/executions/{execution_id}/",
        f"/api/reactor/executions/{execution_id}/step-runs/",
    ]
    return pages
