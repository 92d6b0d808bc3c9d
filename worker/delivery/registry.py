"""Which dispatcher sends each channel: one setting, checked when a process starts.

`GATEKEEPER_DISPATCHERS` is a JSON object, channel -> dispatcher:
`{"email": "smtp", "push": "fcm", "sms": "twilio"}`. A dispatcher is a name of NAMES (`smtp`
through EMAIL_URL; `fcm`, `apns`, `webhook` for push; `twilio` for sms; `console`, `memory`,
`null` for any channel), the name of an email service provider django-anymail has a backend for
(`postmark`, `sendgrid`, `mailgun`, `amazon_ses`, `resend`, ...), or the dotted path of a class
of your own that keeps the contract (worker/delivery/base.py).

A channel the setting leaves out keeps what the earlier settings chose, which are still read:
email through EMAIL_BACKEND (an anymail backend there, as `GATEKEEPER_EMAIL_PROVIDER` sets it,
is that ESP; anything else is `smtp`), push through `GATEKEEPER_PUSH_BACKEND` (the dotted paths
earlier versions documented are read as their names), and any other channel the console.

The checks (`manage.py check` and every process's start): a channel not in GATEKEEPER_CHANNELS,
an unknown dispatcher or one that does not send that channel (worker.E002), an ESP whose package
is missing (worker.E003), an ESP without ANYMAIL_WEBHOOK_SECRET (worker.W001), and whatever a
dispatcher's own `settings_problems` finds (worker.W002: Twilio without its account, a
credential, a sender, or the Auth Token its STOP webhook checks, or a ValidityPeriod Twilio
would refuse).
"""

import functools
import importlib
import json
import pkgutil
import re
from collections.abc import Callable
from typing import Any

import anymail.backends
from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from limits.channels import EMAIL, PUSH, channels
from worker.delivery.addresses import RULES, address_of_any_kind_problem
from worker.delivery.apns import APNsDispatcher
from worker.delivery.base import Dispatcher
from worker.delivery.esp import ANYMAIL_BACKENDS, anymail_dispatcher_class
from worker.delivery.fcm import FCMDispatcher
from worker.delivery.local import ConsoleDispatcher, MemoryDispatcher, NullDispatcher
from worker.delivery.smtp import EmailDispatcher
from worker.delivery.twilio import TwilioDispatcher
from worker.delivery.webhook import WebhookDispatcher

NAMES: dict[str, type[Dispatcher]] = {
    "smtp": EmailDispatcher,
    "fcm": FCMDispatcher,
    "apns": APNsDispatcher,
    "webhook": WebhookDispatcher,
    "twilio": TwilioDispatcher,
    "console": ConsoleDispatcher,
    "memory": MemoryDispatcher,
    "null": NullDispatcher,
}
# GATEKEEPER_PUSH_BACKEND's values as earlier versions documented them.
EARLIER_PATHS = {
    "worker.dispatchers.ConsolePushBackend": "console",
    "worker.dispatchers.MemoryPushBackend": "memory",
    "worker.dispatchers.NullPushBackend": "null",
    "worker.dispatchers.WebhookPushBackend": "webhook",
    "worker.push_providers.FCMPushBackend": "fcm",
    "worker.push_providers.APNsPushBackend": "apns",
}
NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
# Modules of anymail.backends that are no email service provider.
_NOT_ESPS = frozenset({"base", "base_requests", "console", "test"})


def email_providers() -> list[str]:
    """The ESPs django-anymail has a backend for (its modules)."""
    return sorted(
        module.name
        for module in pkgutil.iter_modules(anymail.backends.__path__)
        if module.name not in _NOT_ESPS
    )


def dispatcher_names() -> dict[str, str]:
    """Per channel of GATEKEEPER_CHANNELS, the dispatcher that sends it (a name or a dotted
    path). Raises ImproperlyConfigured saying what is wrong with the setting."""
    given = getattr(settings, "GATEKEEPER_DISPATCHERS", "") or {}
    return _names(
        json.dumps(given, sort_keys=True) if isinstance(given, dict) else str(given),
        tuple(channels()),
        str(getattr(settings, "GATEKEEPER_EMAIL_PROVIDER", "") or "smtp"),
        str(settings.EMAIL_BACKEND),
        str(getattr(settings, "GATEKEEPER_PUSH_BACKEND", "") or "console"),
    )


@functools.lru_cache(maxsize=16)
def _names(
    given: str, known: tuple[str, ...], email_provider: str, email_backend: str, push_backend: str
) -> dict[str, str]:
    chosen: Any = {}
    if given.strip():
        try:
            chosen = json.loads(given)
        except ValueError as exc:
            raise ImproperlyConfigured(
                f"GATEKEEPER_DISPATCHERS is not JSON ({exc}): write an object of channel and "
                'dispatcher, {"email": "smtp", "push": "fcm", "sms": "twilio"}.'
            ) from None
    if not isinstance(chosen, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in chosen.items()
    ):
        raise ImproperlyConfigured(
            "GATEKEEPER_DISPATCHERS is an object of channel and dispatcher name, "
            '{"email": "smtp", "push": "fcm", "sms": "twilio"}.'
        )
    unknown = sorted(set(chosen) - set(known))
    if unknown:
        raise ImproperlyConfigured(
            f"GATEKEEPER_DISPATCHERS names {', '.join(unknown)}, not a channel of "
            f"GATEKEEPER_CHANNELS ({', '.join(known)})."
        )
    if email_provider == "smtp" and email_backend.startswith(ANYMAIL_BACKENDS):
        email_provider = email_backend.removeprefix(ANYMAIL_BACKENDS).partition(".")[0]
    earlier = {
        EMAIL: email_provider,
        PUSH: EARLIER_PATHS.get(push_backend, push_backend),
    }
    return {channel: chosen.get(channel) or earlier.get(channel) or "console" for channel in known}


def dispatcher_class(channel: str) -> type[Dispatcher]:
    """The class that sends `channel`. Raises ImproperlyConfigured for a dispatcher that
    cannot send it (the start-up check says so first)."""
    return _class_of(channel, dispatcher_names()[channel])


@functools.lru_cache(maxsize=32)
def _class_of(channel: str, name: str) -> type[Dispatcher]:
    found: type[Dispatcher]
    if name in NAMES:
        found = NAMES[name]
    elif "." in name:
        try:
            found = import_string(name)
        except ImportError as exc:
            raise ImproperlyConfigured(f"The {channel} dispatcher {name}: {exc}") from None
    elif NAME.fullmatch(name) and name in email_providers():
        found = anymail_dispatcher_class(name)
    else:
        raise ImproperlyConfigured(
            f"'{name[:40]}' is no dispatcher: name one of {', '.join(NAMES)}, an email service "
            "provider django-anymail knows (postmark, sendgrid, amazon_ses, ...), or the dotted "
            "path of a class of your own."
        )
    serves = found.channels
    if serves and channel not in serves:
        raise ImproperlyConfigured(
            f"The dispatcher '{name}' sends {' and '.join(serves)}, not {channel}."
        )
    return found


def dispatcher_for(channel: str) -> Dispatcher:
    """A new dispatcher for `channel`; the caller closes it."""
    return dispatcher_class(channel)()


def address_rule(channel: str) -> Callable[[str], str | None]:
    """What says why an address cannot be sent to on `channel` (or None): the channel's rule,
    then its dispatcher's own. Looked up once (a job's recipients all take the same), since
    finding the dispatcher reads the settings."""
    channel_rule = RULES.get(channel, address_of_any_kind_problem)
    dispatcher_rule = dispatcher_class(channel).address_problem

    def problem(address: str) -> str | None:
        return channel_rule(address) or dispatcher_rule(address)

    return problem


@register()
def dispatchers_check(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    try:
        names = dispatcher_names()
    except ImproperlyConfigured as exc:
        return [Error(str(exc), id="worker.E002")]
    messages: list[CheckMessage] = []
    for channel, name in names.items():
        if NAME.fullmatch(name) and name not in NAMES and name in email_providers():
            found_esp = _esp_problems(name)
            messages.extend(found_esp)
            if any(problem.is_serious() for problem in found_esp):
                continue
        try:
            found = dispatcher_class(channel)
        except ImproperlyConfigured as exc:
            messages.append(Error(f"{channel}: {exc}", id="worker.E002"))
            continue
        if problems := found.settings_problems():
            messages.append(
                Warning(
                    f"{channel} goes through {found.provider or name}, but {'; '.join(problems)}.",
                    hint="docs/worker.md says what each dispatcher's settings are.",
                    id="worker.W002",
                )
            )
    return messages


def _esp_problems(esp: str) -> list[CheckMessage]:
    try:
        backend = importlib.import_module(f"{ANYMAIL_BACKENDS}{esp}")
    except ImportError as exc:  # e.g. boto3 for amazon_ses: anymail names the package
        return [
            Error(
                f"The email provider {esp}: {exc}",
                hint="Install the package it names.",
                id="worker.E003",
            )
        ]
    if not hasattr(backend, "EmailBackend"):
        return [Error(f"{ANYMAIL_BACKENDS}{esp} has no EmailBackend.", id="worker.E002")]
    if not (getattr(settings, "ANYMAIL", None) or {}).get("WEBHOOK_SECRET"):
        return [
            Warning(
                "ANYMAIL_WEBHOOK_SECRET is not set: the tracking webhooks "
                "(/anymail/<esp>/tracking/) refuse every event, so no bounce, complaint or "
                "unsubscribe reaches the suppression list.",
                hint="Set ANYMAIL_WEBHOOK_SECRET=user:password and use it in the ESP's webhook "
                "URL (https://user:password@host/anymail/<esp>/tracking/).",
                id="worker.W001",
            )
        ]
    return []
