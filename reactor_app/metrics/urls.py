"""``path("metrics/", include("reactor_app.metrics.urls"))``: the Prometheus scrape endpoint.

Not access-controlled: the metrics name reactors and steps, not keys or data, but mount it
where only your scraper reaches (an internal port, a network policy), as is usual for
``/metrics``.
"""

from __future__ import annotations

from django.urls import path

from reactor_app.metrics.views import metrics_view

app_name = "reactor_metrics"

urlpatterns = [path("", metrics_view, name="metrics")]
