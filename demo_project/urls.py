"""URLs of the demo project: the admin (with the Coordination page) and the reactor_app API."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/reactor_app/coordination/", permanent=False)),
    path("admin/", admin.site.urls),
    path("api/reactor/", include("reactor_app.api.urls")),
]
