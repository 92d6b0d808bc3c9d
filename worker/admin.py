"""Admin for send jobs: progress and counts, read-only; a job's waiting sends, which a user with
`worker.cancel_sendjob` may cancel (audited in the job's history)."""

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import URLPattern, path, reverse

from gatekeeper.lib.permissions import CANCEL_SENDS
from gatekeeper.lib.words import count
from worker.models import SendJob
from worker.selectors import send_job_waiting
from worker.services import send_job_cancel_waiting


@admin.register(SendJob)
class SendJobAdmin(admin.ModelAdmin):
    change_form_template = "admin/gatekeeper/sendjob_change_form.html"
    list_display = [
        "id",
        "campaign",
        "channel",
        "tags_shown",
        "priority",
        "status",
        "progress",
        "total",
        *SendJob.OUTCOMES,
        "pending",
        "created_at",
    ]
    list_filter = ["status", "channel", "priority"]
    readonly_fields = [*(f.name for f in SendJob._meta.fields), "pending"]

    @admin.display(description="tags")
    def tags_shown(self, job: SendJob) -> str:
        return ", ".join(job.tags) or "-"

    @admin.display(description="pending")
    def pending(self, job: SendJob) -> int:
        return job.pending

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        cancel = path(
            "<int:job_id>/cancel-waiting/",
            self.admin_site.admin_view(self.cancel_waiting_view),
            name="worker_sendjob_cancel_waiting",
        )
        return [cancel, *super().get_urls()]

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        context = dict(extra_context or {})
        if object_id.isascii() and object_id.isdigit():
            context["waiting"] = send_job_waiting(int(object_id))
            context["can_cancel_waiting"] = request.user.has_perms(CANCEL_SENDS)
        return super().change_view(request, object_id, form_url, context)

    def cancel_waiting_view(self, request: HttpRequest, job_id: int) -> HttpResponse:
        """POST only (the button on the job's page, with its CSRF token): cancel the job's
        waiting sends, say what was cancelled, and keep it in the job's history."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not request.user.has_perms(CANCEL_SENDS):
            raise PermissionDenied
        job = get_object_or_404(SendJob, pk=job_id)
        before = job.cancelled
        job = send_job_cancel_waiting(job=job, user=request.user)
        cancelled = job.cancelled - before
        left = send_job_waiting(job.pk)["sends"]
        what = f"Cancelled {count(cancelled, 'waiting send')}"
        if left:
            what += (
                f"; {count(left, 'send')} held by a run or waiting for Redis end within "
                "seconds (every later deferral of this job is cancelled too)"
            )
        self.log_change(request, job, what)  # the job's history, with who and when
        messages.success(request, f"{what}.")
        return HttpResponseRedirect(reverse("admin:worker_sendjob_change", args=[job.pk]))
