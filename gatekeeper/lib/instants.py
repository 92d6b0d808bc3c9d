"""An instant typed in a form (the admin's start and expiry of a send job, a what-if move):
ISO 8601 with its UTC offset, read as the REST bodies read it."""

from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from gatekeeper.lib.bodies import datetime_from_text


class InstantField(forms.CharField):
    """An instant typed as ISO 8601 with its UTC offset; empty: None. The service says whether
    it may be (in the future, not too far ahead)."""

    def clean(self, value: Any) -> Any:
        text = (super().clean(value) or "").strip()
        if not text:
            return None
        try:
            return datetime_from_text(text)
        except ValueError as exc:
            raise ValidationError(str(exc)) from None


INSTANT_FORMAT = "ISO 8601 with its UTC offset (2026-06-11T09:00:00+02:00)"
