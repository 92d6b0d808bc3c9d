"""Errors reported to Sentry: `SENTRY_DSN` (gatekeeper/settings.py) starts sentry-sdk in every
process (web, worker, beat, a command) with its Django and Celery integrations and its defaults:
an error logged, or raised out of a request or a task, is an event.

The integrations that would wrap every Redis command or HTTP call for breadcrumbs are not
enabled: the gate makes thousands a second, and they would add to each. No personal data is
sent (`send_default_pii` off: no user, no IP address, no cookies), and no performance tracing
unless `SENTRY_TRACES_SAMPLE_RATE` asks for it.
"""

import sentry_sdk
from sentry_sdk.integrations.celery import CeleryIntegration
from sentry_sdk.integrations.django import DjangoIntegration


def sentry_start(*, dsn: str, environment: str, traces_sample_rate: float) -> None:
    """Report errors to the Sentry project of `dsn` from this process."""
    sentry_sdk.init(
        dsn=dsn,
        environment=environment or None,
        integrations=[DjangoIntegration(), CeleryIntegration()],
        auto_enabling_integrations=False,
        send_default_pii=False,
        # None, not 0: no transaction is even started unless some are sampled.
        traces_sample_rate=traces_sample_rate or None,
    )
