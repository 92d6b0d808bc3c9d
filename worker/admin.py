"""Admin for send jobs: a campaign file handed over (`worker.add_sendjob`), a job's live
progress and counts; pause, resume, cancel, and its waiting sends cancelled
(`worker.cancel_sendjob`, each audited in the job's history); a job's round and value. And
rounds: made, edited while open and cancelled (wait or cancel their jobs) with the sends'
rights, each round's jobs with their values, its report once decided."""

from typing import Any, cast

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Count, Q, QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
    JsonResponse,
)
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from gatekeeper.lib.conflicts import Conflict
from gatekeeper.lib.instants import INSTANT_FORMAT, InstantField
from gatekeeper.lib.permissions import CANCEL_SENDS, SEND_CAMPAIGNS, VIEW_SEND_JOBS
from gatekeeper.lib.words import count
from limits.channels import channels, scope_label, scopes
from limits.engine.table import DEFAULT_PRIORITY, PRIORITIES
from limits.models.policy import Topic
from limits.policy.quota import Unavailable
from worker.delivery.mailbox_reads import job_holds
from worker.delivery.rendering import template_names
from worker.models import JOB_CAMPAIGN_MAX, Round, SendJob
from worker.recipients import FILE_FORMAT
from worker.round_services import (
    NAME_MAX,
    ROUND_EDITABLE,
    round_cancel,
    round_create,
    round_edit,
    round_projection_ask,
)
from worker.selectors import send_job_waiting
from worker.services import (
    EDITABLE,
    send_job_cancel,
    send_job_cancel_waiting,
    send_job_edit,
    send_job_from_file,
    send_job_pause,
    send_job_resume,
    send_job_start,
)

CONTROLS = {
    "start": send_job_start,
    "pause": send_job_pause,
    "resume": send_job_resume,
    "cancel": send_job_cancel,
}


class JobFieldsForm(forms.Form):
    """The fields of a job that can change until it starts (worker.services.EDITABLE)."""

    template = forms.ChoiceField(choices=(), help_text="templates/<channel>/<template>/")
    tags = forms.CharField(
        required=False, help_text="Comma separated; tag rules count the sends carrying them."
    )
    priority = forms.IntegerField(
        min_value=PRIORITIES[0],
        max_value=PRIORITIES[1],
        initial=DEFAULT_PRIORITY,
        help_text="Higher is more important; only a rule's reserve reads it.",
    )
    topic = forms.ChoiceField(
        choices=(),
        required=False,
        help_text="What the sends are about; people's preferences per topic govern them.",
    )
    on_capped = forms.ChoiceField(choices=SendJob.OnCapped.choices, label="Capped sends")
    start_at = InstantField(
        required=False,
        label="Start at",
        help_text=f"{INSTANT_FORMAT}; empty: at once. Until then the job is scheduled: it can "
        "be edited, rescheduled, started early or cancelled.",
    )
    reserve = forms.BooleanField(
        required=False,
        label="Reserve its slots",
        help_text="A scheduled job only: until it starts, its predicted sends hold their slots; "
        "an earlier send of a lower priority that would take one is refused.",
    )
    expires_at = InstantField(
        required=False,
        label="Waiting sends expire at",
        help_text=f"{INSTANT_FORMAT}; empty: 24 hours after the start.",
    )
    round = forms.ModelChoiceField(
        queryset=Round.objects.none(),
        required=False,
        empty_label="no round",
        help_text="An open round the job competes in until it closes: it starts at the round's "
        "send time (leave the start empty), on its channel, not reserved.",
    )
    value = forms.FloatField(
        required=False,
        help_text="In a round, what one of its sends is worth (at least 0); empty: each "
        "recipient's own (the file's value column).",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cast(forms.ChoiceField, self.fields["template"]).choices = [
            (t, t) for t in template_names()
        ]
        cast(forms.ModelChoiceField, self.fields["round"]).queryset = rounds_joinable()
        cast(forms.ChoiceField, self.fields["topic"]).choices = [
            ("", "no topic"),
            *Topic.objects.values_list("slug", "name"),
        ]

    def clean_tags(self) -> list[str]:
        return [tag.strip() for tag in self.cleaned_data["tags"].split(",") if tag.strip()]


def rounds_joinable(job: SendJob | None = None) -> QuerySet[Round]:
    """The rounds a job may join (open, not closed), and the one `job` is in."""
    joinable = Q(status=Round.Status.OPEN, closes_at__gt=timezone.now())
    if job is not None:
        joinable |= Q(pk__in=SendJob.objects.filter(pk=job.pk).values("round_id"))
    return Round.objects.filter(joinable).order_by("closes_at", "pk")


class SendFileForm(JobFieldsForm):
    """A campaign file and its job's fields, as the REST API's multipart upload takes them."""

    recipients_file = forms.FileField(
        label="Recipients file", help_text=f"CSV, plain or gzip: {FILE_FORMAT}."
    )
    channel = forms.ChoiceField(choices=())
    campaign = forms.CharField(
        max_length=JOB_CAMPAIGN_MAX,
        help_text="Also the start of each send's message id, <campaign>:<user_id>: a user gets "
        "one send of a campaign.",
    )
    on_invalid = forms.ChoiceField(choices=SendJob.OnInvalid.choices, label="Bad rows")

    field_order = [
        "recipients_file",
        "channel",
        "campaign",
        "template",
        "tags",
        "priority",
        "topic",
        "on_capped",
        "on_invalid",
        "start_at",
        "reserve",
        "expires_at",
        "round",
        "value",
    ]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cast(forms.ChoiceField, self.fields["channel"]).choices = [(c, c) for c in channels()]


class JobEditForm(JobFieldsForm):
    """A scheduled job's fields, edited on its page (start_at is required: to start it now,
    its Start now button; a job joining a round takes the round's send time whatever it says).
    The round it is in is offered with the open ones."""

    def __init__(self, *args: Any, job: SendJob, **kwargs: Any) -> None:
        initial = {name: getattr(job, name) for name in EDITABLE}
        initial["tags"] = ", ".join(job.tags)
        for name in ("start_at", "expires_at"):
            initial[name] = initial[name].isoformat() if initial[name] else ""
        super().__init__(*args, initial=initial, **kwargs)
        cast(forms.ModelChoiceField, self.fields["round"]).queryset = rounds_joinable(job)
        self.fields["start_at"].required = True
        self.fields["start_at"].help_text = f"{INSTANT_FORMAT}."
        self.fields["expires_at"].required = True
        self.fields["expires_at"].help_text = f"{INSTANT_FORMAT}."
        self.job = job

    def changes(self) -> dict[str, Any]:
        """What differs from the job, as send_job_edit takes it (a moved start moves the expiry
        with it unless the expiry was changed too)."""
        data = self.cleaned_data
        changes = {name: data[name] for name in EDITABLE if data[name] != self.initial_value(name)}
        if "round" in changes and changes["round"] is not None and "start_at" in changes:
            del changes["start_at"]  # joining: the round's send time is its start
        return changes

    def initial_value(self, name: str) -> Any:
        value = getattr(self.job, name)
        return list(value) if name == "tags" else value


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
        "start_at",
        "round",
        "progress",
        "total",
        *SendJob.OUTCOMES,
        "pending",
        "created_at",
    ]
    list_filter = ["status", "channel", "priority"]
    # The lease is the reading run's bookkeeping; the progress box says what it means.
    exclude = ["prepare_lease_until"]
    readonly_fields = [
        *(f.name for f in SendJob._meta.fields if f.name not in ("prepare_lease_until",)),
        "pending",
    ]

    @admin.display(description="tags")
    def tags_shown(self, job: SendJob) -> str:
        return ", ".join(job.tags) or "-"

    @admin.display(description="pending")
    def pending(self, job: SendJob) -> int:
        return job.pending

    def has_add_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perms(SEND_CAMPAIGNS))

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view
        return [
            path(
                "<int:job_id>/cancel-waiting/",
                view(self.cancel_waiting_view),
                name="worker_sendjob_cancel_waiting",
            ),
            path(
                "<int:job_id>/progress/",
                view(self.progress_view),
                name="worker_sendjob_progress",
            ),
            path("<int:job_id>/edit/", view(self.edit_view), name="worker_sendjob_edit"),
            path(
                "<int:job_id>/control/<str:action>/",
                view(self.control_view),
                name="worker_sendjob_control",
            ),
            *super().get_urls(),
        ]

    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Send a campaign file: the job is stored at once and read in the background; its page
        shows the progress."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        form = SendFileForm(request.POST or None, request.FILES or None)
        if request.method == "POST" and form.is_valid():
            data = dict(form.cleaned_data)
            upload = data.pop("recipients_file")
            try:
                job = send_job_from_file(
                    fileobj=upload, name=upload.name, user=request.user, **data
                )
            except ValidationError as exc:
                for field, problems in exc.message_dict.items():
                    form.add_error(field if field in form.fields else None, problems)
            except Unavailable as exc:
                form.add_error(None, str(exc))
            else:
                self.log_addition(request, job, f"Sent the file {upload.name}")
                messages.success(
                    request,
                    f"Send job #{job.pk}: its file is being read; nothing goes out before all "
                    "of it is valid.",
                )
                return HttpResponseRedirect(reverse("admin:worker_sendjob_change", args=[job.pk]))
        context = {
            **self.admin_site.each_context(request),
            "title": "Send a campaign file",
            "form": form,
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/gatekeeper/sendjob_upload.html", context)

    def edit_view(self, request: HttpRequest, job_id: int) -> HttpResponse:
        """Edit or reschedule a job that has not started (those who may send campaigns)."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        job = get_object_or_404(SendJob, pk=job_id)
        back = HttpResponseRedirect(reverse("admin:worker_sendjob_change", args=[job.pk]))
        if not job.waits_to_start:
            messages.error(request, f"Send job #{job.pk} has started: it can no longer be edited.")
            return back
        form = JobEditForm(request.POST or None, job=job)
        if request.method == "POST" and form.is_valid():
            changes = form.changes()
            try:
                job = send_job_edit(job=job, changes=changes, user=request.user)
            except ValidationError as exc:
                for field, problems in exc.message_dict.items():
                    form.add_error(field if field in form.fields else None, problems)
            except Conflict as exc:
                messages.error(request, str(exc))
                return back
            else:
                what = ", ".join(str(form[name].label).lower() for name in changes) or "nothing"
                self.log_change(request, job, f"Changed {what} before the start")
                messages.success(
                    request,
                    f"Send job #{job.pk}: changed {what}; it starts at "
                    f"{job.start_at:%Y-%m-%d %H:%M:%S} UTC.",
                )
                return back
        context = {
            **self.admin_site.each_context(request),
            "title": f"Edit or reschedule send job #{job.pk}",
            "form": form,
            "job": job,
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/gatekeeper/sendjob_edit.html", context)

    def progress_view(self, request: HttpRequest, job_id: int) -> JsonResponse:
        """What the job's page polls: its status, progress and counts."""
        if not request.user.has_perms(VIEW_SEND_JOBS):
            raise PermissionDenied
        return JsonResponse(job_progress(get_object_or_404(SendJob, pk=job_id)))

    def control_view(self, request: HttpRequest, job_id: int, action: str) -> HttpResponse:
        """POST only (the buttons on the job's page): start now, pause, resume or cancel."""
        if action not in CONTROLS:
            raise Http404
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not request.user.has_perms(CANCEL_SENDS):
            raise PermissionDenied
        job = get_object_or_404(SendJob, pk=job_id)
        try:
            job = CONTROLS[action](job=job, user=request.user)
        except Conflict as exc:
            messages.error(request, str(exc))
        else:
            done = {
                "start": "Started",
                "pause": "Paused",
                "resume": "Resumed",
                "cancel": "Cancelled",
            }[action]
            self.log_change(request, job, f"{done} the job")
            messages.success(request, f"{done} send job #{job.pk}: it is {job.status} now.")
        return HttpResponseRedirect(reverse("admin:worker_sendjob_change", args=[job.pk]))

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
            context["holds"] = job_holds(int(object_id))
            context["can_cancel_waiting"] = request.user.has_perms(CANCEL_SENDS)
            job = SendJob.objects.filter(pk=int(object_id)).first()
            if job is not None:
                context["job_progress"] = job_progress(job)
                context["progress_url"] = reverse("admin:worker_sendjob_progress", args=[job.pk])
                context["can_edit"] = job.waits_to_start and self.has_add_permission(request)
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


def job_progress(job: SendJob) -> dict[str, Any]:
    """A job's progress as its page shows it (and polls it)."""
    if job.status == SendJob.Status.PREPARING:
        stage = (
            f"reading the file: {job.read_bytes:,} of {job.source_bytes:,} bytes; "
            f"{job.processed:,} settled of what was read"
        )
    elif job.status == SendJob.Status.FAILED:
        stage = "the file was refused: " + (
            f"{count(job.sent, 'send')} went out before its bad line, nothing after it"
            if job.sent
            else "nothing was sent"
        )
    elif job.status == SendJob.Status.SCHEDULED and job.start_at is not None:
        stage = (
            f"{count(job.total, 'recipient')}, starting at "
            f"{job.start_at:%Y-%m-%d %H:%M:%S} UTC; nothing goes out before"
        )
    else:
        stage = f"{job.processed:,} of {count(job.total, 'recipient')} settled"
        waiting = send_job_waiting(job.pk)["sends"] if not job.ended else 0
        if waiting:
            stage += f"; {count(waiting, 'send')} waiting for release"
    return {
        "id": job.pk,
        "status": job.status,
        "progress": job.progress,
        "stage": stage,
        "error": job.error,
        "done": job.ended,
        "paused": job.paused_at is not None,
        "scheduled": job.waits_to_start,
        "counts": {name: getattr(job, name) for name in (*SendJob.OUTCOMES, "pending")},
    }


# --- rounds -------------------------------------------------------------------------------------


class RoundForm(forms.Form):
    """A round's fields as people type them; checked by the services (worker/round_services.py),
    whose errors are shown on their fields."""

    name = forms.CharField(max_length=NAME_MAX)
    channel = forms.ChoiceField(
        choices=(), help_text="The channel its jobs send on, or all: jobs on any channel."
    )
    closes_at = InstantField(
        label="Closes at",
        help_text=f"{INSTANT_FORMAT}. Jobs join, leave or change their value until then; then "
        "each user gets the sends of the highest total value that fit every rule.",
    )
    send_at = InstantField(
        required=False,
        label="Send at",
        help_text=f"{INSTANT_FORMAT}; at or after the close (empty: the close). Its jobs start "
        "then; moving it moves them.",
    )

    def __init__(self, *args: Any, round_: Round | None = None, **kwargs: Any) -> None:
        if round_ is not None:
            kwargs["initial"] = {
                "name": round_.name,
                "closes_at": round_.closes_at.isoformat(),
                "send_at": round_.send_at.isoformat(),
            }
        super().__init__(*args, **kwargs)
        if round_ is not None:
            del self.fields["channel"]  # its jobs were checked against it
            self.fields["send_at"].required = True
            self.fields["send_at"].help_text = (
                f"{INSTANT_FORMAT}; at or after the close. Moving it moves every job in the "
                "round with it."
            )
        else:
            cast(forms.ChoiceField, self.fields["channel"]).choices = [
                (scope, scope_label(scope)) for scope in scopes()
            ]
        self.round = round_

    def changes(self) -> dict[str, Any]:
        """What differs from the round, as round_edit takes it."""
        assert self.round is not None
        return {
            name: self.cleaned_data[name]
            for name in ROUND_EDITABLE
            if self.cleaned_data[name] != getattr(self.round, name)
        }

    def problems_shown(self, exc: ValidationError) -> None:
        for field, problems in exc.message_dict.items():
            self.add_error(field if field in self.fields else None, problems)


class RoundProjectForm(forms.Form):
    """What the round would choose now; with a job and a value, what changing that job's value
    would do."""

    job = forms.ModelChoiceField(
        queryset=SendJob.objects.none(),
        required=False,
        empty_label="its jobs' values as they are",
        label="Try for job",
    )
    value = forms.FloatField(required=False, min_value=0, label="worth")

    def __init__(self, *args: Any, round_: Round, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cast(forms.ModelChoiceField, self.fields["job"]).queryset = round_.jobs.order_by("pk")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("job") is not None and data.get("value") is None:
            self.add_error("value", "Give the value to try for the job.")
        return data


def report_table(report: dict[str, Any], element_id: str) -> str:
    """A round's report (or projection's) as a table: per job, candidates, those that fit
    alone, won, outranked and by which jobs, the value won, and first come, first served on
    the same candidates; the totals under it."""
    rows = format_html_join(
        "",
        "<tr><td>#{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
        "<td>{}</td><td>{}</td><td>{}</td></tr>",
        (
            (
                row["job"],
                row["campaign"],
                row["priority"],
                f"{row['candidates']:,}",
                f"{row['fit_alone']:,}",
                f"{row['won']:,}",
                f"{row['outranked']:,}",
                ", ".join(f"#{by['job']}: {by['count']:,}" for by in row["outranked_by"]) or "-",
                f"{row['value_won']:,.2f}",
                f"{row['first_come']['won']:,} worth {row['first_come']['value']:,.2f}",
            )
            for row in report["jobs"]
        ),
    )
    return format_html(
        '<table class="gk-table" id="{}"><caption>Worth {} by value against {} first come, '
        "first served: {} more ({} users with a send that fits, {} with two or more)</caption>"
        "<thead><tr><th>Job</th><th>Campaign</th><th>Priority</th><th>Candidates</th>"
        "<th>Fit alone</th><th>Won</th><th>Outranked</th><th>Outranked by</th>"
        "<th>Value won</th><th>First come, first served</th></tr></thead>"
        "<tbody>{}</tbody></table>",
        element_id,
        f"{report['value_won']:,.2f}",
        f"{report['first_come_value']:,.2f}",
        f"{report['gain']:,.2f}",
        f"{report['users']:,}",
        f"{report['contested']:,}",
        rows,
    )


class RoundCancelForm(forms.Form):
    jobs = forms.ChoiceField(
        choices=[
            ("wait", "Let its jobs wait: they leave the round and start at their start time"),
            ("cancel", "Cancel its jobs: nothing of them goes out"),
        ],
        widget=forms.RadioSelect,
        label="Its jobs",
    )


@admin.register(Round)
class RoundAdmin(admin.ModelAdmin):
    """Rounds: their list, a round's page (its jobs with their values, the report once
    decided), made, edited while open and cancelled through worker/round_services.py, with the
    sends' rights (reading: `worker.view_sendjob`; writing: `worker.add_sendjob`)."""

    change_form_template = "admin/gatekeeper/round_change_form.html"
    list_display = [
        "id",
        "name",
        "channel",
        "status",
        "closes_at",
        "send_at",
        "job_count",
        "decided_at",
    ]
    list_filter = ["status", "channel"]
    fields = (
        "name",
        "channel",
        "status",
        "closes_at",
        "send_at",
        "jobs_shown",
        "decided_at",
        "differences",
        "report_shown",
        "projection_shown",
        "cancelled_at",
        "created_by",
        "created_at",
    )
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[Round]:
        return super().get_queryset(request).annotate(jobs_in=Count("jobs"))

    @admin.display(description="jobs", ordering="jobs_in")
    def job_count(self, round_: Round) -> int:
        return int(getattr(round_, "jobs_in", 0))

    @admin.display(description="jobs")
    def jobs_shown(self, round_: Round) -> str:
        jobs = round_.jobs.order_by("created_at", "pk")
        if not jobs:
            return "None has joined."
        rows = format_html_join(
            "",
            '<tr><td><a href="{}">#{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>'
            "<td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    reverse("admin:worker_sendjob_change", args=[job.pk]),
                    job.pk,
                    job.campaign,
                    job.channel,
                    job.status,
                    job.priority,
                    "each recipient's own" if job.value is None else f"{job.value:g}",
                    f"{job.total:,}",
                    f"{job.created_at:%Y-%m-%d %H:%M:%S}",
                )
                for job in jobs
            ),
        )
        return format_html(
            '<table class="gk-table" id="round-jobs"><thead><tr><th>Job</th><th>Campaign</th>'
            "<th>Channel</th><th>Status</th><th>Priority</th><th>Value</th><th>Recipients</th>"
            "<th>Made (UTC)</th></tr></thead><tbody>{}</tbody></table>",
            rows,
        )

    @admin.display(description="report")
    def report_shown(self, round_: Round) -> str:
        if round_.status != Round.Status.DECIDED or round_.report is None:
            return "Once decided."
        return report_table(round_.report, "round-report")

    @admin.display(description="projection")
    def projection_shown(self, round_: Round) -> str:
        """What the open round would choose now, as last asked (with the values tried)."""
        if round_.status != Round.Status.OPEN:
            return "Of an open round."
        projection = round_.projection
        if not projection:
            return "None asked yet: Project it (below the round's state)."
        tried = projection.get("values") or {}
        words = (
            "its jobs' values as they are"
            if not tried
            else "with "
            + ", ".join(f"job #{job} worth {value:g}" for job, value in sorted(tried.items()))
        )
        return format_html(
            '<p id="round-projection-at">Projected at {} UTC, {}.</p>{}',
            projection["at"][:19].replace("T", " "),
            words,
            report_table(projection["report"], "round-projection"),
        )

    def has_module_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perms(VIEW_SEND_JOBS))

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.has_perms(VIEW_SEND_JOBS))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perms(SEND_CAMPAIGNS))

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # edited and cancelled on its own pages, through the services

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # cancelled, never deleted: its jobs name it

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view
        return [
            path("<int:round_id>/edit/", view(self.edit_view), name="worker_round_edit"),
            path("<int:round_id>/cancel/", view(self.cancel_view), name="worker_round_cancel"),
            path("<int:round_id>/project/", view(self.project_view), name="worker_round_project"),
            *super().get_urls(),
        ]

    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Make a round: checked by round_create, its problems shown on their fields."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        form = RoundForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            try:
                made = round_create(user=request.user, **form.cleaned_data)
            except ValidationError as exc:
                form.problems_shown(exc)
            else:
                self.log_addition(request, made, "Made the round")
                messages.success(
                    request,
                    f"Round #{made.pk} is open: jobs join it until "
                    f"{made.closes_at:%Y-%m-%d %H:%M:%S} UTC.",
                )
                return HttpResponseRedirect(reverse("admin:worker_round_change", args=[made.pk]))
        return self._form_page(request, form, "Add round", None)

    def edit_view(self, request: HttpRequest, round_id: int) -> HttpResponse:
        """Change an open round's name and times (round_edit; a moved send time moves its
        jobs)."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        round_ = get_object_or_404(Round, pk=round_id)
        back = HttpResponseRedirect(reverse("admin:worker_round_change", args=[round_.pk]))
        form = RoundForm(request.POST or None, round_=round_)
        if request.method == "POST" and form.is_valid():
            changes = form.changes()
            try:
                round_ = round_edit(round_=round_, changes=changes, user=request.user)
            except ValidationError as exc:
                form.problems_shown(exc)
            except Conflict as exc:
                messages.error(request, str(exc))
                return back
            else:
                what = ", ".join(str(form[name].label).lower() for name in changes) or "nothing"
                self.log_change(request, round_, f"Changed {what}")
                messages.success(request, f"Round #{round_.pk}: changed {what}.")
                return back
        return self._form_page(request, form, f"Edit round #{round_.pk}", round_)

    def cancel_view(self, request: HttpRequest, round_id: int) -> HttpResponse:
        """Asks what becomes of the round's jobs (wait, or cancel), then cancels it."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        round_ = get_object_or_404(Round, pk=round_id)
        back = HttpResponseRedirect(reverse("admin:worker_round_change", args=[round_.pk]))
        form = RoundCancelForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            jobs = form.cleaned_data["jobs"]
            try:
                round_ = round_cancel(round_=round_, jobs=jobs, user=request.user)
            except Conflict as exc:
                messages.error(request, str(exc))
            else:
                what = "its jobs wait" if jobs == "wait" else "its jobs cancelled"
                self.log_change(request, round_, f"Cancelled the round: {what}")
                messages.success(request, f"Cancelled round #{round_.pk}: {what}.")
            return back
        return self._form_page(request, form, f"Cancel round #{round_.pk}", round_, cancel=True)

    def project_view(self, request: HttpRequest, round_id: int) -> HttpResponse:
        """Project an open round now, optionally with one job's value tried instead of its own
        (round_projection_ask; computed in the background)."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        round_ = get_object_or_404(Round, pk=round_id)
        back = HttpResponseRedirect(reverse("admin:worker_round_change", args=[round_.pk]))
        if request.method != "POST":
            return back
        form = RoundProjectForm(request.POST, round_=round_)
        if not form.is_valid():
            for problems in form.errors.values():
                messages.error(request, " ".join(str(p) for p in problems))
            return back
        job, value = form.cleaned_data["job"], form.cleaned_data["value"]
        values = {job.pk: value} if job is not None and value is not None else {}
        try:
            round_projection_ask(round_=round_, values=values)
        except (Conflict, ValidationError) as exc:
            messages.error(request, " ".join(getattr(exc, "messages", [str(exc)])))
        else:
            messages.success(
                request,
                "Projecting the round"
                + (f" with job #{job.pk} worth {value:g}" if values else "")
                + ": the projection below changes within a minute (reload the page).",
            )
        return back

    def _form_page(
        self,
        request: HttpRequest,
        form: forms.Form,
        title: str,
        round_: Round | None,
        *,
        cancel: bool = False,
    ) -> HttpResponse:
        context = {
            **self.admin_site.each_context(request),
            "title": title,
            "form": form,
            "round": round_,
            "cancel": cancel,
            "jobs": round_.jobs.count() if round_ is not None else 0,
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/gatekeeper/round_form.html", context)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        context = dict(extra_context or {})
        if object_id.isascii() and object_id.isdigit():
            round_ = Round.objects.filter(pk=int(object_id)).first()
            if round_ is not None:
                context["can_write"] = (
                    round_.status == Round.Status.OPEN and self.has_add_permission(request)
                )
                context["closed"] = round_.closes_at <= timezone.now()
                context["project_form"] = RoundProjectForm(round_=round_)
        return super().change_view(request, object_id, form_url, context)


# Sending domains and their DNS checks, mailbox providers and warm-up plans: modules of their own.
from worker import admin_domains, admin_mailboxes  # noqa: E402,F401
