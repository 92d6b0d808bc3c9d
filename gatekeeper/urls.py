from django.contrib import admin
from django.urls import include, path

from limits.people.preference_page import preference_page
from limits.people.unsubscribe import unsubscribe_view
from worker.delivery.twilio_inbound import twilio_inbound_view
from worker.metrics import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    # REST API v1, its schema and docs, /healthz and /readyz.
    path("", include("gatekeeper.api_urls")),
    path("metrics", metrics_view, name="metrics"),
    # One-click unsubscribe (RFC 8058): the signed link in every marketing email; no login.
    path("u/<str:token>/", unsubscribe_view, name="unsubscribe"),
    # A person's preference page: the signed link in every message (`{{ preferences_url }}`).
    path("p/<str:token>/", preference_page, name="preferences"),
    # The email providers' tracking webhooks (/anymail/<esp>/tracking/, ANYMAIL_WEBHOOK_SECRET).
    path("anymail/", include("anymail.urls")),
    # Twilio's incoming message webhook: STOP and START replies (X-Twilio-Signature).
    path("twilio/inbound/", twilio_inbound_view, name="twilio_inbound"),
]
