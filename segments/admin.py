"""Admin for segments, their user lists and builds."""

from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from gatekeeper.lib.integers import DIGITS, INT32_MAX, WholeNumberField
from gatekeeper.lib.words import count
from gatekeeper.lib.zones import zone_names
from segments.index import get_index
from segments.models import Build, Segment, UserList
from segments.parsing import UserListError
from segments.services import user_list_import


class UserListForm(forms.ModelForm):
    upload = forms.FileField(
        required=False, help_text="One user id a line, text or .gz; an optional header line."
    )

    class Meta:
        model = UserList
        fields: list[str] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            # A stored list is replaced by uploading a new one, not edited in place.
            self.fields["upload"].disabled = True


class UserListInline(admin.TabularInline):
    model = UserList
    form = UserListForm
    extra = 1
    fields = ["upload", "original_name", "state", "id_count", "lines", "uploaded_at", "uploaded_by"]
    readonly_fields = ["original_name", "state", "id_count", "lines", "uploaded_at", "uploaded_by"]

    @admin.display(description="state")
    def state(self, user_list: UserList) -> str:
        if user_list.status == UserList.Status.VALIDATING:
            return (
                f"validating in the background ({count(user_list.line_count, 'line')} read so far)"
            )
        if user_list.status == UserList.Status.FAILED:
            return f"refused: {user_list.error}"
        return "ready"

    @admin.display(description="lines")
    def lines(self, user_list: UserList) -> str:
        return user_list.lines_explained

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False if obj is None else super().has_change_permission(request, obj)


class TimeZoneInput(forms.TextInput):
    """A text box that suggests the known IANA zones as one types ("Europe/Pa...")."""

    def __init__(self) -> None:
        super().__init__(attrs={"list": "time-zones", "size": 32, "autocomplete": "off"})

    def render(self, name: str, value: Any, attrs: Any = None, renderer: Any = None) -> Any:
        options = format_html_join("", '<option value="{}">', ((z,) for z in zone_names()))
        box = super().render(name, value, attrs, renderer)
        return box + format_html('<datalist id="time-zones">{}</datalist>', options)


@admin.register(Segment)
class SegmentAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "slug",
        "priority",
        "users_in_snapshot",
        "share",
        "caps_link",
        "last_list",
        "last_build",
        "zone",
        "is_default",
    ]
    list_editable = ["priority"]
    ordering = ["priority"]
    prepopulated_fields = {"slug": ("name",)}
    inlines = [UserListInline]
    change_form_template = "admin/gatekeeper/segment_change_form.html"

    def get_readonly_fields(self, request: HttpRequest, obj: Segment | None = None) -> Any:
        # A slug names the segment in snapshots and caps: set once, never changed.
        return ["slug"] if obj is not None else []

    def get_prepopulated_fields(self, request: HttpRequest, obj: Segment | None = None) -> Any:
        return {} if obj is not None else self.prepopulated_fields

    def formfield_for_dbfield(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "priority":
            # The one rule for whole numbers (the REST API's and the commands').
            return WholeNumberField(
                maximum=INT32_MAX,
                what="Priority",
                label="Priority",
                help_text=db_field.help_text,
                widget=forms.TextInput(attrs={"inputmode": "numeric", "size": 8}),
            )
        if db_field.name == "time_zone":
            # The model's validator is the one rule for a zone (gatekeeper.lib.zones).
            kwargs["widget"] = TimeZoneInput()
            kwargs["help_text"] = (
                "Its users' IANA time zone, such as Europe/Paris, when a send names none: "
                "calendar windows (a day, a week, a month) start at their local midnight. Empty: "
                f"the setting GATEKEEPER_DEFAULT_TIME_ZONE ({settings.GATEKEEPER_DEFAULT_TIME_ZONE})."
            )
        return super().formfield_for_dbfield(db_field, request, **kwargs)

    @admin.display(description="time zone")
    def zone(self, segment: Segment) -> str:
        return segment.time_zone or f"default ({settings.GATEKEEPER_DEFAULT_TIME_ZONE})"

    @admin.display(description="users in the live snapshot")
    def users_in_snapshot(self, segment: Segment) -> str:
        index = get_index()
        if index is None:
            return "no snapshot"
        if segment.is_default:
            return "everyone else"
        return f"{index.cardinalities.get(segment.slug, 0):,}"

    @admin.display(description="caps")
    def caps_link(self, segment: Segment) -> str:
        url = reverse("admin:cap_grid", args=[segment.pk])
        return format_html('<a href="{}">caps of {}</a>', url, segment.name)

    @admin.display(description="last build")
    def last_build(self, segment: Segment) -> str:
        build = (
            Build.objects.filter(status=Build.Status.SUCCEEDED, stats__has_key=segment.slug)
            .order_by("-finished_at")
            .first()
        )
        if build is None or build.finished_at is None:
            return "not built yet"
        return f"#{build.pk}, {build.finished_at:%Y-%m-%d %H:%M}"

    @admin.display(description="latest list")
    def last_list(self, segment: Segment) -> str:
        latest = segment.user_lists.order_by("-uploaded_at").first()
        if latest is None:
            return "-" if not segment.is_default else "everyone not listed"
        return (
            f"{latest.original_name}: {count(latest.id_count, 'user')}, "
            f"{latest.uploaded_at:%Y-%m-%d %H:%M}"
        )

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> Any:
        context = {**(extra_context or {})}
        if object_id and DIGITS.fullmatch(object_id):
            context["caps_url"] = reverse("admin:cap_grid", args=[int(object_id)])
            if request.user.has_perm("limits.view_rule"):
                rules = reverse("admin:limits_rule_changelist")
                context["rules_url"] = f"{rules}?segment__id__exact={object_id}"
            if request.user.has_perm("limits.view_quiethours"):
                quiet = reverse("admin:limits_quiethours_changelist")
                context["quiet_hours_url"] = f"{quiet}?segment__id__exact={object_id}"
        return super().change_view(request, object_id, form_url, context)

    @admin.display(description="share of listed users")
    def share(self, segment: Segment) -> str:
        index = get_index()
        if index is None or segment.is_default or not index.total_users:
            return "-"
        return f"{100 * index.cardinalities.get(segment.slug, 0) / index.total_users:.1f}%"

    def has_delete_permission(self, request: HttpRequest, obj: Segment | None = None) -> bool:
        if obj is not None and obj.is_default:
            return False
        return super().has_delete_permission(request, obj)

    def save_formset(self, request: HttpRequest, form: Any, formset: Any, change: bool) -> None:
        # Uploads go through the same validation as everywhere; a bad line is shown on the form.
        formset.new_objects, formset.changed_objects, formset.deleted_objects = [], [], []
        for inline_form in formset.forms:
            upload = (
                inline_form.cleaned_data.get("upload")
                if hasattr(inline_form, "cleaned_data")
                else None
            )
            if upload:
                try:
                    stored = user_list_import(
                        segment=form.instance,
                        fileobj=upload,
                        name=upload.name,
                        user=request.user,
                        inline_bytes=int(settings.GATEKEEPER_USER_LIST_INLINE_BYTES),
                    )
                except UserListError as exc:
                    messages.error(
                        request, f"{upload.name}: {exc.messages[0]}. Nothing was stored."
                    )
                    continue
                if stored.status == UserList.Status.VALIDATING:
                    messages.info(
                        request,
                        f"{upload.name} is large: it is being validated in the background. Its "
                        "state below says when it is ready (or why it was refused); builds use "
                        "it once it is ready.",
                    )
                else:
                    messages.success(
                        request,
                        f"{upload.name}: stored, {count(stored.id_count, 'user')} "
                        f"({stored.lines_explained}). Build and publish to make it live.",
                    )
        for deleted in formset.deleted_forms:
            if deleted.instance.pk:
                deleted.instance.delete()


@admin.register(Build)
class BuildAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "state",
        "progress",
        "stage",
        "version",
        "total_users",
        "snapshot_bytes",
        "created_at",
        "duration_seconds",
        "error_summary",
    ]
    # The per-segment figures are shown as a table above the fields (build_change_form.html).
    exclude = ["stats"]
    readonly_fields = [f.name for f in Build._meta.fields if f.name != "stats"]
    # Builds are started from the Snapshots page (one "Build and publish" button).
    actions = None
    change_form_template = "admin/gatekeeper/build_change_form.html"

    @admin.display(description="status")
    def state(self, build: Build) -> str:
        """A queued or running build whose worker stopped reporting reads "stalled"."""
        return build.state

    @admin.display(description="error")
    def error_summary(self, build: Build) -> str:
        return build.error[:120] + ("…" if len(build.error) > 120 else "")

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> Any:
        build = Build.objects.filter(pk=object_id).first() if DIGITS.fullmatch(object_id) else None
        context = {**(extra_context or {})}
        if build is not None:
            context["build"] = build
            context["progress_url"] = reverse("admin:build_progress", args=[build.pk])
            context["segment_stats"] = [
                {"slug": slug, **values}
                for slug, values in (build.stats or {}).items()
                if isinstance(values, dict)
            ]
        return super().change_view(request, object_id, form_url, context)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
