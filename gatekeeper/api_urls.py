"""URLs of the REST API (v1), its OpenAPI schema and docs, and the health probes."""

from django.http import HttpRequest, JsonResponse
from django.urls import path, re_path
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from limits.ledger.api import DecisionsReportView, HistoryView
from limits.people.api.preferences import PreferencesView
from limits.people.api.preferences_import import PreferencesImportView
from limits.people.api.suppressions import (
    SuppressionDetailView,
    SuppressionImportView,
    SuppressionListView,
    SuppressionRemoveView,
)
from limits.policy.api.caps import CapDetailView, CapListView
from limits.policy.api.holdout import HoldoutView
from limits.policy.api.quota import QuotaView
from limits.policy.api.rules import (
    QuietHoursDetailView,
    QuietHoursListView,
    RuleDetailView,
    RuleListView,
)
from limits.policy.api.topics import TopicDetailView, TopicListView
from limits.privacy.api import EraseView, ErasureView, ExportView
from limits.stream.api import StreamView, WebhookDetailView, WebhookListView
from limits.studies.api.events import EventsView
from limits.studies.api.experiments import (
    ExperimentConcludeView,
    ExperimentDetailView,
    ExperimentListView,
    ExperimentReportView,
    ExperimentStopView,
)
from segments.api import (
    BuildDetailView,
    LookupView,
    SegmentDetailView,
    SegmentListView,
    SegmentUsersView,
    SnapshotActivateView,
    SnapshotListView,
)
from worker.api import (
    BacktestDetailView,
    BacktestListView,
    GateCheckView,
    GateReleaseView,
    PlanView,
    RoundCancelView,
    RoundDetailView,
    RoundListView,
    RoundReportView,
    SendJobCancelView,
    SendJobDetailView,
    SendJobListView,
    SendJobPauseView,
    SendJobPlanView,
    SendJobResumeView,
    SendJobStartView,
    SendJobWaitingView,
)
from worker.api_mailboxes import (
    MailboxProviderDetailView,
    MailboxProviderListView,
    MailboxProviderResumeView,
    WarmupDetailView,
    WarmupListView,
)
from worker.health import healthz, readyz

v1 = [
    path("segments/", SegmentListView.as_view(), name="segments"),
    path("segments/lookup/", LookupView.as_view(), name="segment-lookup"),
    path("segments/<slug:slug>/", SegmentDetailView.as_view(), name="segment"),
    path("segments/<slug:slug>/users/", SegmentUsersView.as_view(), name="segment-users"),
    path("limits/", CapListView.as_view(), name="caps"),
    path("limits/<str:segment>/<str:channel>/", CapDetailView.as_view(), name="cap"),
    path("rules/", RuleListView.as_view(), name="rules"),
    path("rules/<int:rule_id>/", RuleDetailView.as_view(), name="rule"),
    path("quiet-hours/", QuietHoursListView.as_view(), name="quiet-hours"),
    path(
        "quiet-hours/<int:quiet_hours_id>/",
        QuietHoursDetailView.as_view(),
        name="quiet-hours-entry",
    ),
    path("topics/", TopicListView.as_view(), name="topics"),
    path("topics/<slug:slug>/", TopicDetailView.as_view(), name="topic"),
    path("holdout/", HoldoutView.as_view(), name="holdout"),
    path("experiments/", ExperimentListView.as_view(), name="experiments"),
    path("events/", EventsView.as_view(), name="events"),
    path(
        "reports/experiments/<str:study>/",
        ExperimentReportView.as_view(),
        name="experiment-report",
    ),
    path("experiments/<int:experiment_id>/", ExperimentDetailView.as_view(), name="experiment"),
    path(
        "experiments/<int:experiment_id>/stop/",
        ExperimentStopView.as_view(),
        name="experiment-stop",
    ),
    path(
        "experiments/<int:experiment_id>/conclude/",
        ExperimentConcludeView.as_view(),
        name="experiment-conclude",
    ),
    path("suppressions/", SuppressionListView.as_view(), name="suppressions"),
    path("suppressions/remove/", SuppressionRemoveView.as_view(), name="suppressions-remove"),
    path(
        "suppressions/<str:channel>/import/",
        SuppressionImportView.as_view(),
        name="suppressions-import",
    ),
    path(
        "suppressions/<str:channel>/<str:user_id>/",
        SuppressionDetailView.as_view(),
        name="suppression",
    ),
    path("gate/check/", GateCheckView.as_view(), name="gate-check"),
    path("gate/release/", GateReleaseView.as_view(), name="gate-release"),
    path("users/<str:user_id>/quota/", QuotaView.as_view(), name="quota"),
    path("users/<str:user_id>/history/", HistoryView.as_view(), name="history"),
    path("users/<str:user_id>/export/", ExportView.as_view(), name="export"),
    path("stream/", StreamView.as_view(), name="stream"),
    path("webhooks/", WebhookListView.as_view(), name="webhooks"),
    path("webhooks/<int:webhook_id>/", WebhookDetailView.as_view(), name="webhook"),
    path("users/erase/", EraseView.as_view(), name="users-erase"),
    path("erasures/<int:erasure_id>/", ErasureView.as_view(), name="erasure"),
    path("users/<str:user_id>/preferences/", PreferencesView.as_view(), name="preferences"),
    path("preferences/import/", PreferencesImportView.as_view(), name="preferences-import"),
    path("snapshots/", SnapshotListView.as_view(), name="snapshots"),
    path(
        "snapshots/<str:version>/activate/",
        SnapshotActivateView.as_view(),
        name="snapshot-activate",
    ),
    path("builds/<int:build_id>/", BuildDetailView.as_view(), name="build"),
    path("reports/decisions/", DecisionsReportView.as_view(), name="decisions-report"),
    path("sends/", SendJobListView.as_view(), name="sends"),
    path("sends/<int:job_id>/", SendJobDetailView.as_view(), name="send"),
    path("sends/<int:job_id>/waiting/", SendJobWaitingView.as_view(), name="send-waiting"),
    path("sends/<int:job_id>/start/", SendJobStartView.as_view(), name="send-start"),
    path("sends/<int:job_id>/plan/", SendJobPlanView.as_view(), name="send-plan"),
    path("plan/", PlanView.as_view(), name="plan"),
    path("backtests/", BacktestListView.as_view(), name="backtests"),
    path("backtests/<int:backtest_id>/", BacktestDetailView.as_view(), name="backtest"),
    path("sends/<int:job_id>/pause/", SendJobPauseView.as_view(), name="send-pause"),
    path("sends/<int:job_id>/resume/", SendJobResumeView.as_view(), name="send-resume"),
    path("sends/<int:job_id>/cancel/", SendJobCancelView.as_view(), name="send-cancel"),
    path("rounds/", RoundListView.as_view(), name="rounds"),
    path("rounds/<int:round_id>/", RoundDetailView.as_view(), name="round"),
    path("rounds/<int:round_id>/cancel/", RoundCancelView.as_view(), name="round-cancel"),
    path("rounds/<int:round_id>/report/", RoundReportView.as_view(), name="round-report"),
    path("mailbox-providers/", MailboxProviderListView.as_view(), name="mailbox-providers"),
    path(
        "mailbox-providers/<slug:slug>/",
        MailboxProviderDetailView.as_view(),
        name="mailbox-provider",
    ),
    path(
        "mailbox-providers/<slug:slug>/resume/",
        MailboxProviderResumeView.as_view(),
        name="mailbox-provider-resume",
    ),
    path("warmups/", WarmupListView.as_view(), name="warmups"),
    path("warmups/<int:warmup_id>/", WarmupDetailView.as_view(), name="warmup"),
]


@csrf_exempt  # so that a PUT to a wrong path gets its 404, not a CSRF page
def api_not_found(request: HttpRequest) -> JsonResponse:
    # Clients of the API read JSON, also for a path that matches nothing (`builds/-1/`).
    return JsonResponse({"detail": "Not found."}, status=404)


urlpatterns = [
    *[path(f"api/v1/{p.pattern}", p.callback, name=p.name) for p in v1],
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("healthz", healthz, name="healthz"),
    path("readyz", readyz, name="readyz"),
    re_path(r"^api/", api_not_found),
]
