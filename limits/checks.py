"""Settings the limiter depends on, checked when a process starts (`manage.py check` too), each
error with a stable id."""

import re
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register

from gatekeeper.lib.zones import UnknownTimeZone, zone
from limits.channels import ALL

CHANNEL = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")


@register()
def limits_settings_check(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    try:
        zone(str(settings.GATEKEEPER_DEFAULT_TIME_ZONE))
    except UnknownTimeZone as exc:
        errors.append(
            Error(
                f"GATEKEEPER_DEFAULT_TIME_ZONE: {exc}",
                hint="Users' time zone when neither the send nor their segment names one.",
                id="limits.E001",
            )
        )
    names = list(settings.GATEKEEPER_CHANNELS)
    for name in names:
        if not CHANNEL.fullmatch(name) or name == ALL:
            errors.append(
                Error(
                    f"GATEKEEPER_CHANNELS: '{name}' is not a channel name.",
                    hint="Lowercase letters, digits, - and _, up to 32, and not 'all' (the "
                    "scope of every channel together).",
                    id="limits.E002",
                )
            )
    if len(set(names)) != len(names) or not names:
        errors.append(
            Error("GATEKEEPER_CHANNELS: name each channel once, at least one.", id="limits.E003")
        )
    for name, hint, check_id in (
        (
            "GATEKEEPER_LOG_SWEEP_BUCKETS",
            "Keys of the send logs (groups, buckets) the sweep of aged-out logs looks at per "
            "run (every minute).",
            "limits.E004",
        ),
        ("GATEKEEPER_LEDGER_DAYS", "Days the send ledger keeps.", "limits.E005"),
        (
            "GATEKEEPER_EVENTS_DEDUP_DAYS",
            "Days an outcome event's id is remembered, so that a repeat counts once.",
            "limits.E009",
        ),
        (
            "GATEKEEPER_LEDGER_BUFFER_MAX",
            "Gate calls the ledger's Redis stream holds undrained.",
            "limits.E006",
        ),
    ):
        if int(getattr(settings, name)) < 1:
            errors.append(Error(f"{name} must be at least 1.", hint=hint, id=check_id))
    if float(settings.GATEKEEPER_SUPPRESSION_TTL_SECONDS) < 0:
        errors.append(
            Error(
                "GATEKEEPER_SUPPRESSION_TTL_SECONDS must be 0 or more.",
                hint="How long a process decides by its suppression list before reading changes.",
                id="limits.E007",
            )
        )
    if float(settings.GATEKEEPER_BEAT_LOCK_SECONDS) < 3:
        errors.append(
            Error(
                "GATEKEEPER_BEAT_LOCK_SECONDS must be at least 3.",
                hint="How long the beat leader's lease lasts unrenewed; the leader renews it "
                "every third of it, so shorter would hand the lead to and fro.",
                id="limits.E010",
            )
        )
    errors.extend(_public_url_problems(str(settings.GATEKEEPER_PUBLIC_URL)))
    return errors


def _public_url_problems(url: str) -> list[CheckMessage]:
    """The unsubscribe links' base: an absolute http(s) URL, https unless on loopback."""
    parts = urlsplit(url)
    hint = "Where recipients reach this gatekeeper, as https://gate.example.com."
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        return [
            Error(
                f"GATEKEEPER_PUBLIC_URL: '{url[:80]}' is not an http(s) address.",
                hint=hint,
                id="limits.E008",
            )
        ]
    if parts.scheme == "http" and parts.hostname not in ("127.0.0.1", "localhost", "::1"):
        return [
            Warning(
                f"GATEKEEPER_PUBLIC_URL is {url[:80]}: mailbox providers only honour one-click "
                "unsubscribe links over https (RFC 8058).",
                hint=hint,
                id="limits.W001",
            )
        ]
    return []
