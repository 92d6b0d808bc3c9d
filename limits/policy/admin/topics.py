"""Admin of topics: a form checked by the one rule for topics, each topic in plain words, its
history, and writes through its authored kind (`TOPICS.create`, `.update`, `.delete` in
limits/policy/services.py). A topic's slug is typed once, when it is made, and never changes."""

from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest

from limits.channels import channels, noun
from limits.engine.topics import (
    TopicFields,
    channels_words,
    topic_as_json,
    topic_json_describe,
    topic_problems,
)
from limits.models.policy import Topic
from limits.policy.admin.base import AuthoredAdmin
from limits.policy.services import TOPICS


class TopicForm(forms.ModelForm):
    channels = forms.MultipleChoiceField(
        choices=[],
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="The channels it is sent on. None ticked: every channel.",
    )
    default = forms.ChoiceField(
        choices=Topic.Default.choices,
        widget=forms.RadioSelect,
        initial=Topic.Default.SUBSCRIBED,
        help_text="Required topics are for notices that no preference may block (a change of "
        "terms); people see them on their page without a switch.",
    )

    class Meta:
        model = Topic
        fields = ["slug", "name", "description", "channels", "default"]
        help_texts = {
            "slug": "Letters, digits, - and _. Sends and people's preferences name the topic "
            "by it, so it never changes once the topic is made.",
            "description": "What people get under this topic, in the words of their preference "
            "page.",
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "channels" in self.fields:
            choices = [(c, noun(c, 2)) for c in channels()]
            self.fields["channels"].choices = choices  # type: ignore[attr-defined]

    def authored_fields(self) -> TopicFields:
        """The topic as typed; a field that did not parse reads as empty (it has its error)."""
        data = self.cleaned_data
        slug = data.get("slug") or (self.instance.slug if self.instance.pk else "")
        return TopicFields(
            slug=slug,
            name=data.get("name") or "",
            description=data.get("description") or "",
            channels=list(data.get("channels") or []),
            default=data.get("default") or "",
        )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        # The one rule for topics, as the REST API applies it; its fields are named as the
        # form's.
        for field, problems in topic_problems(self.authored_fields()).items():
            if field not in self.fields or field in self.errors:
                continue  # already told what is wrong with it (or not on the form)
            for problem in problems:
                self.add_error(field, problem)
        return data


@admin.register(Topic)
class TopicAdmin(AuthoredAdmin):
    authored = TOPICS
    history_id = "topic-history"
    counted = ("topic", "topics")
    actions = ["delete_selected"]
    form = TopicForm
    list_display = ["name", "slug", "sent_on", "default", "reading"]
    list_display_links = ["name"]
    list_filter = ["default"]
    search_fields = ["slug", "name"]

    def reading_of(self, topic: Topic) -> str:
        return topic_json_describe(topic_as_json(topic))

    @admin.display(description="channels")
    def sent_on(self, topic: Topic) -> str:
        return channels_words(topic.channels or [])

    def get_fieldsets(self, request: HttpRequest, obj: Topic | None = None) -> Any:
        fieldsets: list[tuple[str | None, dict[str, Any]]] = [
            (None, {"fields": ["slug", "name", "description"]}),
            ("Where and for whom", {"fields": ["channels", "default"]}),
        ]
        if obj is None:
            return fieldsets
        return [
            ("At a glance", {"fields": ["reading"]}),
            *fieldsets,
            ("History", {"fields": ["made", "history"]}),
        ]

    def get_readonly_fields(self, request: HttpRequest, obj: Topic | None = None) -> Any:
        return [] if obj is None else ["slug", "reading", "made", "history"]
