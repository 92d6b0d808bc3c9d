"""URLs of the REST API (v1), its OpenAPI schema and docs, and the health probes."""

from django.urls import URLPattern, URLResolver

urlpatterns: list[URLPattern | URLResolver] = []
