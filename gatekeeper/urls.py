from django.contrib import admin
from django.urls import include, path

from worker.metrics import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    # REST API v1, its schema and docs, /healthz and /readyz.
    path("", include("gatekeeper.api_urls")),
    path("metrics", metrics_view, name="metrics"),
]
