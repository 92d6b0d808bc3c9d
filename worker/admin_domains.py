"""Admin of sending domains (docs/deliverability.md, "Checking a sending domain"): added,
changed and deleted through the one write path (worker/delivery/sending_domains.py), the form's
errors from the one rule for their fields; and each domain's DNS check, linked from the list and
from its page: SPF, DKIM per selector, DMARC and alignment, each with what was found and what to
fix. DNS that cannot answer shows as "could not check", never as an error page."""

from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html

from limits.policy.admin.base import history_url
from worker.delivery.dns_checks import (
    SELECTORS_MAX,
    Check,
    SendingDomainFields,
    Status,
    domain_checked,
)
from worker.delivery.sending_domains import (
    SENDING_DOMAINS,
    SendingDomainInvalid,
    sending_domain_change,
    sending_domain_checked,
    sending_domain_create,
    sending_domain_delete,
)
from worker.models import SendingDomain


def selectors_split(text: str) -> tuple[str, ...]:
    """Selectors as typed: separated by commas, spaces or lines."""
    return tuple(s for s in text.replace(",", " ").split() if s)


class SendingDomainForm(forms.ModelForm):
    dkim_selectors = forms.CharField(
        required=False,
        label="DKIM selectors",
        help_text=f"The selectors your email provider signs this domain's mail with, separated "
        f"by commas or spaces (SendGrid: s1, s2; Mailchimp: k1); at most {SELECTORS_MAX}.",
    )

    class Meta:
        model = SendingDomain
        fields = ["domain", "dkim_selectors", "return_path"]
        help_texts = {
            "domain": "The domain your marketing mail is From (the part after the @), such as "
            "news.example.com.",
            "return_path": "The bounce (envelope sender) domain your provider uses, such as "
            "bounces.example.com or the provider's own; empty when it is the domain.",
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            self.initial["dkim_selectors"] = ", ".join(self.instance.dkim_selectors)

    def clean_dkim_selectors(self) -> list[str]:
        return list(selectors_split(self.cleaned_data.get("dkim_selectors") or ""))

    def typed(self) -> SendingDomainFields:
        data = self.cleaned_data
        return SendingDomainFields(
            domain=(data.get("domain") or "").strip(),
            dkim_selectors=tuple(data.get("dkim_selectors") or ()),
            return_path=(data.get("return_path") or "").strip(),
        )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        try:
            # The write path's own check (the rule, and a domain added already) on the form.
            sending_domain_checked(self.typed(), row_id=self.instance.pk)
        except SendingDomainInvalid as exc:
            for field, problems in exc.problems.items():
                if field in self.fields and field not in self.errors:
                    for problem in problems:
                        self.add_error(field, problem)
        return data

    def validate_unique(self) -> None:
        """The domain's uniqueness is the write path's rule (said on the field in `clean`)."""


@admin.register(SendingDomain)
class SendingDomainAdmin(admin.ModelAdmin):
    form = SendingDomainForm
    list_display = ["domain", "selectors_shown", "return_path_shown", "dns_link", "created_at"]
    search_fields = ["domain"]
    readonly_fields = ["created_at"]
    change_form_template = "admin/gatekeeper/sendingdomain_change_form.html"

    @admin.display(description="DKIM selectors")
    def selectors_shown(self, row: SendingDomain) -> str:
        return ", ".join(row.dkim_selectors) or "none named"

    @admin.display(description="return path", ordering="return_path")
    def return_path_shown(self, row: SendingDomain) -> str:
        return row.return_path or "the domain itself"

    @admin.display(description="DNS")
    def dns_link(self, row: SendingDomain) -> str:
        url = reverse("admin:worker_sendingdomain_dns", args=[row.pk])
        return format_html('<a href="{}">Check DNS<span class="visually-hidden"> of {}</span></a>',
                           url, row.domain)  # fmt: skip

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view
        return [
            path("<int:row_id>/dns/", view(self.dns_view), name="worker_sendingdomain_dns"),
            *super().get_urls(),
        ]

    def dns_view(self, request: HttpRequest, row_id: int) -> HttpResponse:
        """The domain checked in DNS now: each check's status in words, what was found where,
        and what to fix."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        row = get_object_or_404(SendingDomain, pk=row_id)
        report = domain_checked(
            row.domain, dkim_selectors=row.dkim_selectors, return_path=row.return_path
        )
        context = {
            **self.admin_site.each_context(request),
            "title": f"DNS of {row.domain}",
            "opts": self.model._meta,
            "original": row,
            "report": report,
            "counts": _counted(report.checks),
        }
        return TemplateResponse(request, "admin/gatekeeper/sendingdomain_dns.html", context)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        context = dict(extra_context or {})
        if object_id.isascii() and object_id.isdigit():
            context["changes_url"] = history_url(SENDING_DOMAINS.kind, int(object_id))
        return super().change_view(request, object_id, form_url, context)

    def save_model(self, request: HttpRequest, obj: SendingDomain, form: Any, change: bool) -> None:
        # Through the one write path, so every change is in the history with who made it.
        fields = form.typed()
        if change:
            saved = sending_domain_change(obj, fields=fields, by=request.user, via="admin")
        else:
            saved = sending_domain_create(fields=fields, by=request.user, via="admin")
        obj.pk = saved.pk
        obj.refresh_from_db()

    def delete_model(self, request: HttpRequest, obj: SendingDomain) -> None:
        sending_domain_delete(obj, by=request.user, via="admin")

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[SendingDomain]) -> None:
        for row in queryset:
            sending_domain_delete(row, by=request.user, via="admin")


COUNTED = {
    Status.OK: ("OK", "OK"),
    Status.WARNING: ("warning", "warnings"),
    Status.PROBLEM: ("problem", "problems"),
    Status.UNKNOWN: ("could not be checked", "could not be checked"),
}


def _counted(checks: tuple[Check, ...]) -> str:
    """The checks' statuses counted, in words: "3 OK, 1 warning, 1 problem"."""
    said = []
    for status, (one, many) in COUNTED.items():
        n = sum(check.status == status for check in checks)
        if n:
            said.append(f"{n} {one if n == 1 else many}")
    return ", ".join(said)
