"""Admin of deliverability's settings (worker/delivery/mailbox_settings.py, the one write path):
the mailbox providers, their domains and rates (read in words on the list), a paused one shown
with the brake's figures and resumed by a button; the sending domains' warm-up plans, each with
its ramp and today's day (per group the volume, what went out, what waits), the default ramp a
click away when adding one. Forms are checked by each kind's one rule, errors shown by field;
every save and delete goes through the write path, so that the history records it."""

import json
from datetime import UTC
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import url_has_allowed_host_and_scheme

from gatekeeper.lib.conflicts import Conflict
from gatekeeper.lib.words import count
from limits.policy.admin.base import history_table, history_url
from worker.delivery.mailbox_reads import (
    braked_waiting_count,
    braked_waiting_counts,
    ramp_words,
    warmup_today,
    why_figures,
)
from worker.delivery.mailbox_settings import (
    MAILBOXES,
    WARMUPS,
    mailbox_change,
    mailbox_create,
    mailbox_delete,
    mailbox_resume,
    mailbox_undeletable,
    rate_words,
    warmup_change,
    warmup_create,
    warmup_default,
    warmup_delete,
)
from worker.delivery.mailboxes import GROUPS_MAX, OTHER, mailbox_problems, rates_normalised
from worker.delivery.warmup import plan_of, warmup_problems
from worker.models import MailboxProvider, WarmupPlan

RATES_HELP = (
    'A JSON list, one entry a dispatcher: [{"dispatcher": "smtp", "per_second": 20, '
    '"per_minute": 600}, {"dispatcher": "*", "per_hour": 50000}]. "dispatcher" is a '
    'provider\'s name (smtp, amazon_ses, ...) or "*" for every dispatcher without its own; '
    "give per_second, per_minute or per_hour (the tightest holds). Messages to this group all "
    "workers together send. Empty: not held."
)
VOLUMES_HELP = (
    'A JSON object: each group\'s volume for each day from the first, {"gmail": [50, 100, '
    '200], "microsoft": [50, 100]}; after the last day the last holds until a day\'s sends '
    "reach it. A group not named is not held. Each day at least 1."
)


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def _problems_shown(form: forms.BaseForm, problems: dict[str, list[str]]) -> None:
    """The rule's problems on their fields (on the form as a whole for one it does not show)."""
    for field, messages_ in problems.items():
        if field in form.errors:
            continue  # the field's own check said it already
        for message in messages_:
            form.add_error(field if field in form.fields else None, message)


def _back(request: HttpRequest, default: str) -> HttpResponseRedirect:
    wanted = request.POST.get("next", "")
    safe = url_has_allowed_host_and_scheme(
        wanted, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    )
    return HttpResponseRedirect(wanted if wanted and safe else default)


def _changes_table(kind: Any, object_id: int, table_id: str) -> str:
    return history_table(
        kind.changes(object_id),
        lambda change, names: change.words,
        table_id=table_id,
        link=history_url(kind.kind, object_id),
    )


# --- mailbox providers ----------------------------------------------------------------------


class MailboxProviderForm(forms.ModelForm):
    domains = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 5}),
        help_text="Recipient domains, one a line, lowercase: gmail.com, or hotmail.* for every "
        "last label (hotmail.com, hotmail.co.uk). A domain is in one group only; 'other' takes "
        "every domain no group names.",
    )
    mx_hosts = forms.CharField(
        required=False,
        label="MX hosts",
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="MX host suffixes, one a line (google.com): a domain no group names is "
        "matched by its mail servers, when GATEKEEPER_MAILBOX_MX_LOOKUP is on.",
    )
    rates = forms.JSONField(
        required=False, widget=forms.Textarea(attrs={"rows": 4}), help_text=RATES_HELP
    )

    class Meta:
        model = MailboxProvider
        fields = ["slug", "name", "domains", "mx_hosts", "rates"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            self.initial["domains"] = "\n".join(self.instance.domains)
            self.initial["mx_hosts"] = "\n".join(self.instance.mx_hosts)
            self.initial["rates"] = rates_normalised(self.instance.rates)

    def clean_domains(self) -> list[str]:
        return _lines(self.cleaned_data.get("domains") or "")

    def clean_mx_hosts(self) -> list[str]:
        return _lines(self.cleaned_data.get("mx_hosts") or "")

    def clean_rates(self) -> Any:
        rates = self.cleaned_data.get("rates")
        return [] if rates in (None, "") else rates

    def typed(self) -> dict[str, Any]:
        data = self.cleaned_data
        return {
            "slug": self.instance.slug if self.instance.pk else data.get("slug", ""),
            "name": data.get("name", ""),
            "domains": data.get("domains", []),
            "mx_hosts": data.get("mx_hosts", []),
            "rates": data.get("rates", []),
        }

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        fields = self.typed()
        others = {
            slug: list(domains)
            for slug, domains in MailboxProvider.objects.exclude(slug=fields["slug"]).values_list(
                "slug", "domains"
            )
        }
        problems = mailbox_problems(fields, others=others)
        if not self.instance.pk and MailboxProvider.objects.count() >= GROUPS_MAX:
            problems.setdefault("slug", []).append(f"At most {GROUPS_MAX} groups.")
        _problems_shown(self, problems)
        return data


@admin.register(MailboxProvider)
class MailboxProviderAdmin(admin.ModelAdmin):
    form = MailboxProviderForm
    change_list_template = "admin/gatekeeper/mailboxprovider_change_list.html"
    change_form_template = "admin/gatekeeper/mailboxprovider_change_form.html"
    list_display = ["name", "slug", "domains_shown", "rates_shown", "state", "waiting"]
    search_fields = ["slug", "name"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        if obj is None:
            return []
        return ["slug", "rates_shown", "state", "waiting", "resumed_at", "history"]

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        main = ["slug", "name", "domains", "mx_hosts", "rates"]
        if obj is None:
            return [(None, {"fields": main})]
        return [
            (None, {"fields": [*main, "rates_shown"]}),
            ("Brake", {"fields": ["state", "waiting", "resumed_at"]}),
            ("Changes", {"fields": ["history"]}),
        ]

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        # The waiting counts of every group on the page, in one query.
        self._waiting = braked_waiting_counts(
            MailboxProvider.objects.values_list("slug", flat=True)
        )
        return super().changelist_view(request, extra_context)

    @admin.display(description="domains")
    def domains_shown(self, row: MailboxProvider) -> str:
        if row.slug == OTHER:
            return "every domain no group names"
        shown = ", ".join(row.domains[:6])
        more = len(row.domains) - 6
        return f"{shown} and {more} more" if more > 0 else shown or "-"

    @admin.display(description="rates")
    def rates_shown(self, row: MailboxProvider) -> str:
        rates = rates_normalised(row.rates)
        return "; ".join(map(rate_words, rates)) if rates else "not held"

    @admin.display(description="state")
    def state(self, row: MailboxProvider) -> str:
        if row.paused_at is None:
            return "sending"
        figures = why_figures(row.paused_why or {})
        words = (row.paused_why or {}).get("words", "")
        return format_html(
            "<strong>paused by its brake</strong> since {} UTC{}{}",
            f"{row.paused_at:%Y-%m-%d %H:%M}",
            f": {figures}" if figures else "",
            f". {words}" if words else "",
        )

    @admin.display(description="email waiting for its brake")
    def waiting(self, row: MailboxProvider) -> str:
        found = getattr(self, "_waiting", {}).get(row.slug)
        return count(found if found is not None else braked_waiting_count(row.slug), "recipient")

    @admin.display(description="changes")
    def history(self, row: MailboxProvider) -> str:
        return _changes_table(MAILBOXES, row.pk, "mailbox-history")

    # --- writes: through the one write path ---

    def save_model(
        self, request: HttpRequest, obj: MailboxProvider, form: Any, change: bool
    ) -> None:
        fields = form.typed()
        if change:
            stored = MailboxProvider.objects.get(pk=obj.pk)
            edited = {name: fields[name] for name in ("name", "domains", "mx_hosts", "rates")}
            saved = mailbox_change(stored, edited, by=request.user, via="admin")
        else:
            saved = mailbox_create(fields, by=request.user, via="admin")
        obj.pk = saved.pk
        obj.refresh_from_db()

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.slug == OTHER:
            return False  # it takes every domain no group names
        return super().has_delete_permission(request, obj)

    def delete_view(
        self, request: HttpRequest, object_id: str, extra_context: Any = None
    ) -> HttpResponse:
        row = MailboxProvider.objects.filter(pk=object_id if object_id.isdigit() else 0).first()
        problem = mailbox_undeletable(row) if row is not None else None
        if problem is not None:
            messages.error(request, problem)
            return HttpResponseRedirect(
                reverse("admin:worker_mailboxprovider_change", args=[object_id])
            )
        return super().delete_view(request, object_id, extra_context)

    def delete_model(self, request: HttpRequest, obj: MailboxProvider) -> None:
        mailbox_delete(obj, by=request.user, via="admin")

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[MailboxProvider]) -> None:
        for row in queryset:
            problem = mailbox_undeletable(row)
            if problem is not None:
                messages.error(request, f"{row.name} was kept: {problem}")
                continue
            mailbox_delete(row, by=request.user, via="admin")

    # --- resume ---

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "<slug:slug>/resume/",
                self.admin_site.admin_view(self.resume_view),
                name="worker_mailboxprovider_resume",
            ),
            *super().get_urls(),
        ]

    def resume_view(self, request: HttpRequest, slug: str) -> HttpResponse:
        """POST only (the banner's and the group page's button, with its CSRF token): resume a
        group its brake paused, through the write path (recorded, via admin)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        row = get_object_or_404(MailboxProvider, slug=slug)
        if not self.has_change_permission(request, row):
            return HttpResponse(status=403)
        waiting = braked_waiting_count(row.slug)
        try:
            row = mailbox_resume(row, by=request.user, via="admin")
        except Conflict as exc:
            messages.error(request, str(exc))
        else:
            messages.success(
                request,
                f"Resumed {row.name}: {count(waiting, 'waiting recipient')} handed out now; "
                "its brake counts only mail sent from now on.",
            )
        return _back(request, reverse("admin:worker_mailboxprovider_changelist"))


# --- warm-up plans ----------------------------------------------------------------------------


def _groups() -> list[str]:
    return list(MailboxProvider.objects.values_list("slug", flat=True))


class WarmupPlanForm(forms.ModelForm):
    volumes = forms.JSONField(
        required=False, widget=forms.Textarea(attrs={"rows": 8, "cols": 80}), help_text=""
    )

    class Meta:
        model = WarmupPlan
        fields = ["domain", "time_zone", "starts_on", "volumes"]
        help_texts = {
            "domain": "The sending domain, such as mail.example.com (DEFAULT_FROM_EMAIL's is "
            "the one email goes out from).",
            "time_zone": "The IANA time zone its days start in, such as Europe/Paris.",
            "starts_on": "Its first day (day 1).",
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["volumes"]
        if self.instance.pk:
            field.help_text = VOLUMES_HELP
        else:
            self.fields["starts_on"].initial = timezone.now().date()
            field.help_text = format_html(
                '{} Empty: the default ramp for every group but other. <a href="?ramp=default" '
                'id="default-ramp">Use the default ramp</a> (to edit it here).',
                VOLUMES_HELP,
            )

    def typed(self) -> dict[str, Any]:
        data = self.cleaned_data
        return {name: data.get(name) for name in ("domain", "time_zone", "starts_on", "volumes")}

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        fields = self.typed()
        if fields["volumes"] in (None, "", {}) and not self.instance.pk:
            fields["volumes"] = warmup_default(_groups())
            data["volumes"] = fields["volumes"]
        _problems_shown(self, warmup_problems(fields, groups=_groups()))
        return data


@admin.register(WarmupPlan)
class WarmupPlanAdmin(admin.ModelAdmin):
    form = WarmupPlanForm
    list_display = ["domain", "starts_on", "time_zone", "today", "ramp", "over"]
    search_fields = ["domain"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [] if obj is None else ["today_table", "ramp", "ended_shown", "history"]

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        main = ["domain", "time_zone", "starts_on", "volumes"]
        if obj is None:
            return [(None, {"fields": main})]
        return [
            ("Today", {"fields": ["today_table"]}),
            (None, {"fields": [*main, "ramp", "ended_shown"]}),
            ("Changes", {"fields": ["history"]}),
        ]

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, Any]:
        initial = super().get_changeform_initial_data(request)
        initial.pop("ramp", None)
        if request.GET.get("ramp") == "default":
            initial["volumes"] = json.dumps(warmup_default(_groups()))
        return initial

    @admin.display(description="today")
    def today(self, row: WarmupPlan) -> str:
        if plan_of(row).over:
            return "over: nothing held"
        day = plan_of(row).day(timezone.now())[0] + 1
        longest = max((len(ramp) for ramp in row.volumes.values()), default=0)
        return f"day {day} of {longest}" if day >= 1 else f"starts on {row.starts_on:%Y-%m-%d}"

    @admin.display(description="ramp")
    def ramp(self, row: WarmupPlan) -> str:
        return format_html_join(
            "", "<div>{}: {}</div>", ((g, ramp_words(r)) for g, r in sorted(row.volumes.items()))
        )

    @admin.display(description="over", boolean=True)
    def over(self, row: WarmupPlan) -> bool:
        return plan_of(row).over

    @admin.display(description="ramps ended")
    def ended_shown(self, row: WarmupPlan) -> str:
        ended = sorted(row.ended.items())
        return ", ".join(f"{g} on {day}" for g, day in ended) or "none yet"

    @admin.display(description="today, per group")
    def today_table(self, row: WarmupPlan) -> str:
        today = warmup_today(row)
        day = (
            f"Day {today['day']}, {today['date']:%Y-%m-%d}"
            if today["day"]
            else f"Before its first day ({row.starts_on:%Y-%m-%d}); today is {today['date']:%Y-%m-%d}"
        )
        rows = format_html_join(
            "",
            '<tr><th>{}</th><td class="num">{}</td><td class="num">{}</td>'
            '<td class="num">{}</td></tr>',
            (
                (
                    group,
                    f"{figures['volume']:,}" if figures["volume"] is not None else "not held",
                    f"{figures['sent']:,}" if figures["sent"] is not None else "unknown",
                    f"{figures['waiting']:,}",
                )
                for group, figures in today["groups"].items()
            ),
        )
        return format_html(
            '<p id="warmup-day">{} in {}; the next day starts at {} UTC.</p>'
            '<table class="gk-table" id="warmup-today"><thead><tr><th>Group</th>'
            "<th>Volume</th><th>Sent</th><th>Waiting for a next day</th></tr></thead>"
            "<tbody>{}</tbody></table>",
            day,
            row.time_zone,
            f"{today['next_day_at'].astimezone(UTC):%Y-%m-%d %H:%M}",
            rows,
        )

    @admin.display(description="changes")
    def history(self, row: WarmupPlan) -> str:
        return _changes_table(WARMUPS, row.pk, "warmup-history")

    # --- writes: through the one write path ---

    def save_model(self, request: HttpRequest, obj: WarmupPlan, form: Any, change: bool) -> None:
        fields = form.typed()
        if change:
            stored = WarmupPlan.objects.get(pk=obj.pk)
            saved = warmup_change(stored, fields, by=request.user, via="admin")
        else:
            if fields["volumes"] in (None, "", {}):
                fields.pop("volumes")
            saved = warmup_create(fields, by=request.user, via="admin")
        obj.pk = saved.pk
        obj.refresh_from_db()

    def delete_model(self, request: HttpRequest, obj: WarmupPlan) -> None:
        warmup_delete(obj, by=request.user, via="admin")

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[WarmupPlan]) -> None:
        for row in queryset:
            warmup_delete(row, by=request.user, via="admin")
