"""The email provider setting, checked when a process starts (`manage.py check` too)."""

import importlib
import pkgutil
import re
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register

ESP = re.compile(r"[a-z][a-z0-9_]{0,31}")
# Modules of anymail.backends that are no email service provider.
_NOT_ESPS = frozenset({"base", "base_requests", "console", "test"})


def email_providers() -> list[str]:
    """The ESPs django-anymail has a backend for (its modules)."""
    import anymail.backends

    return sorted(
        module.name
        for module in pkgutil.iter_modules(anymail.backends.__path__)
        if module.name not in _NOT_ESPS
    )


@register()
def email_provider_check(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    provider = str(getattr(settings, "GATEKEEPER_EMAIL_PROVIDER", "smtp"))
    if provider == "smtp":
        return []
    hint = f"smtp (EMAIL_URL), or one of: {', '.join(email_providers())}."
    if not ESP.fullmatch(provider) or provider not in email_providers():
        return [
            Error(
                f"GATEKEEPER_EMAIL_PROVIDER: '{provider[:40]}' is neither smtp nor an email "
                "service provider django-anymail knows.",
                hint=hint,
                id="worker.E002",
            )
        ]
    try:
        backend = importlib.import_module(f"anymail.backends.{provider}")
    except ImportError as exc:  # e.g. boto3 for amazon_ses: anymail names the package
        return [
            Error(
                f"GATEKEEPER_EMAIL_PROVIDER={provider}: {exc}",
                hint="Install the package it names.",
                id="worker.E003",
            )
        ]
    messages: list[CheckMessage] = []
    if not hasattr(backend, "EmailBackend"):
        messages.append(
            Error(f"anymail.backends.{provider} has no EmailBackend.", hint=hint, id="worker.E002")
        )
    if not (getattr(settings, "ANYMAIL", None) or {}).get("WEBHOOK_SECRET"):
        messages.append(
            Warning(
                "ANYMAIL_WEBHOOK_SECRET is not set: the tracking webhooks "
                "(/anymail/<esp>/tracking/) refuse every event, so no bounce, complaint or "
                "unsubscribe reaches the suppression list.",
                hint="Set ANYMAIL_WEBHOOK_SECRET=user:password and use it in the ESP's webhook "
                "URL (https://user:password@host/anymail/<esp>/tracking/).",
                id="worker.W001",
            )
        )
    return messages
