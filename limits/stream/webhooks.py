"""The event stream posted to the company's endpoints: signed batches, at least once.

Each endpoint (`WebhookEndpoint`) has its own position in the stream (limits/stream/events.py)
and its filters. Beat's `webhooks_deliver_due` (every second) queues a delivery run for each
endpoint that is due; a run holds the endpoint by a lease (one run per endpoint at a time) and
posts what the stream holds after its position, up to BATCH events a request, until it has
caught up or RUN_SECONDS passed. So a batch is what came in since the last one, a second's
worth or up to 1,000 events.

- **At least once.** The position moves past a batch only once the endpoint answered it with a
  2xx. A run that dies between the answer and the move posts the batch again: every event keeps
  its `id`, by which the receiver drops a repeat.
- **Signed** as Standard Webhooks (standardwebhooks.com) and Svix sign: headers `webhook-id`
  (the batch: the same for the same events), `webhook-timestamp` (Unix seconds) and
  `webhook-signature`: `v1,` and the base64 HMAC-SHA256, keyed with the endpoint's secret
  (`whsec_` and base64), of `<webhook-id>.<webhook-timestamp>.<body>`. A receiver refuses a
  timestamp more than a few minutes off its clock, so a recorded request cannot be replayed.
- **Retried** while it fails (an answer other than 2xx, a timeout, no connection): after 5 s,
  then twice as long each time up to an hour, and paused (`failing`, shown in the admin) once it
  has failed for 3 days; resumed by a person (admin or REST), from where it stopped. Nothing is
  lost meanwhile: the events stay in the stream as long as the ledger keeps its rows.
- Every attempt is kept a week (`WebhookDelivery`): when, which batch, the answer, how long.
"""

import base64
import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import requests
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from gatekeeper.lib.accounts import account_acting
from gatekeeper.lib.leases import RowLease, lease_free
from gatekeeper.lib.problems import Problems
from gatekeeper.lib.weburls import http_url_problem
from limits.ledger.reports import FILTER_PROBLEMS
from limits.models.stream import WebhookDelivery, WebhookEndpoint
from limits.policy.authored import Action, Kind, SettingKind, deleted
from limits.stream.events import (
    Filters,
    Position,
    position_from_text,
    stream_end,
    stream_read,
    type_problem,
)

logger = logging.getLogger(__name__)

SECRET_PREFIX = "whsec_"
BATCH_MAX = 1000  # events a request at most
BATCH = BATCH_MAX
RUN_SECONDS = 10.0  # a delivery run posts for this long at most, then the next one goes on
LEASE = timedelta(seconds=60)  # a run's hold on its endpoint, renewed after each request
TIMEOUT = (5.0, 10.0)  # connecting, then waiting for the answer (seconds)
FIRST_RETRY = 5.0  # seconds; doubled each failure
LONGEST_RETRY = 3600.0
GIVE_UP_AFTER = timedelta(days=3)  # failing this long: paused
KEEP_DELIVERIES = timedelta(days=7)
FILTERS_MAX = 100  # types, channels or campaigns an endpoint names at most
State = WebhookEndpoint.State


def secret_new() -> str:
    """A new signing secret: whsec_ and 32 random bytes in base64."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def signature(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header's value for a request (Standard Webhooks' v1)."""
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    signed = f"{message_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.digest(key, signed, hashlib.sha256)).decode()


# --- endpoints, as people make and change them ---------------------------------------------------


@dataclass(frozen=True)
class WebhookFields:
    url: str
    description: str = ""
    types: tuple[str, ...] = ()
    channels: tuple[str, ...] = ()
    campaigns: tuple[str, ...] = ()


def webhook_problems(fields: WebhookFields) -> dict[str, list[str]]:
    """What is wrong with an endpoint's fields, by field: the one rule, REST and admin alike."""
    problems: dict[str, list[str]] = {}
    if problem := http_url_problem(fields.url):
        problems["url"] = [problem]
    checks = (
        ("types", fields.types, type_problem),
        ("channels", fields.channels, FILTER_PROBLEMS["channel"]),
        ("campaigns", fields.campaigns, FILTER_PROBLEMS["campaign"]),
    )
    for name, values, problem_of in checks:
        if len(values) > FILTERS_MAX:
            problems[name] = [f"At most {FILTERS_MAX}; these are {len(values)}."]
            continue
        found = [p for p in map(problem_of, values) if p]
        if found:
            problems[name] = found[:1]
        elif len(set(values)) != len(values):
            problems[name] = ["Each once."]
    if len(fields.description) > 500:
        problems["description"] = ["At most 500 characters."]
    return problems


class WebhookInvalid(Problems):
    """An endpoint's fields that break its rule (webhook_problems), every one named."""


def _checked(fields: WebhookFields) -> WebhookFields:
    fields = WebhookFields(
        url=fields.url, description=fields.description, types=tuple(fields.types),
        channels=tuple(fields.channels), campaigns=tuple(fields.campaigns),
    )  # fmt: skip
    problems = webhook_problems(fields)
    if problems:
        raise WebhookInvalid(problems)
    return fields


def start_position(start: str) -> str:
    """Where a new endpoint starts: `end` (only what comes next), `0` (everything the stream
    keeps) or a position; a Problem naming `start` otherwise."""
    return str(position_from_text(start, field="start"))


# What the history keeps of an endpoint: what people set, never its secret nor its runs'
# bookkeeping (what they delivered, their failures).
RECORDED = ("id", "url", "description", "types", "channels", "campaigns", "state", "position")


def webhook_recorded(endpoint: WebhookEndpoint) -> dict[str, Any]:
    """An endpoint as its history keeps it (RECORDED of what REST answers), its lists copied:
    the history's `before` stays as it was whatever the change does to the row."""
    shown = webhook_shown(endpoint)
    return {
        name: list(v) if isinstance(v, list) else v for name, v in shown.items() if name in RECORDED
    }


def _value(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "every one"
    return str(value) if value not in (None, "") else "none"


def webhook_change_words(action: str, before: Any, after: Any) -> str:
    """An endpoint's change in words: made, gone, a new secret, or which fields changed."""
    if action == Action.CREATED:
        return f"Created: events POSTed to {after['url']} from {after['position']}."
    if action == Action.DELETED:
        return f"Deleted: nothing more is POSTed to {before['url']}."
    changed = [
        f"{key}: {_value(before.get(key))} → {_value(after.get(key))}"
        for key in after
        if before.get(key) != after.get(key)
    ]
    if action == Action.SECRET_ROTATED:
        changed.insert(0, "a new secret: requests are signed with it from now on")
    return "; ".join(changed) or "Nothing visible changed."


# Webhook endpoints in the one write path: each change recorded (without the secret), a new
# secret as its own action.
WEBHOOKS: SettingKind[WebhookEndpoint] = SettingKind(
    kind=Kind.WEBHOOK,
    model=WebhookEndpoint,
    as_json=webhook_recorded,
    label=lambda endpoint: endpoint.url,
    worded=webhook_change_words,
    invalidates=False,
)


def webhook_create(
    *, fields: WebhookFields, by: Any = None, start: str = "end", via: str = "api"
) -> WebhookEndpoint:
    """A new endpoint, active, with a new secret, delivering from `start`. WebhookInvalid names
    the bad fields; nothing is made then."""
    fields = _checked(fields)
    position = start_position(start)

    def made(_: WebhookEndpoint | None) -> WebhookEndpoint:
        return WebhookEndpoint.objects.create(
            url=fields.url, description=fields.description, types=list(fields.types),
            channels=list(fields.channels), campaigns=list(fields.campaigns),
            secret=secret_new(), position=position, created_by=account_acting(by),
        )  # fmt: skip

    endpoint = WEBHOOKS.write(Action.CREATED, locate=lambda: None, change=made, user=by, via=via)
    assert endpoint is not None
    return endpoint


def webhook_change(
    endpoint: WebhookEndpoint,
    *,
    fields: WebhookFields | None = None,
    active: bool | None = None,
    start: str | None = None,
    new_secret: bool = False,
    by: Any = None,
    via: str = "api",
) -> WebhookEndpoint:
    """Change an endpoint: its fields (checked whole), paused or active again (a failing one
    resumes from where it stopped, at once), its position (`start`: replay or skip), a new
    secret. WebhookInvalid or a Problem naming `start` say what is wrong; nothing changes
    then. The row is changed as it is now (locked), so a delivery run's bookkeeping stays."""
    if fields is not None:
        fields = _checked(fields)
    position = start_position(start) if start is not None else None

    def changed(row: WebhookEndpoint | None) -> WebhookEndpoint:
        assert row is not None
        if fields is not None:
            row.url, row.description = fields.url, fields.description
            row.types, row.channels = list(fields.types), list(fields.channels)
            row.campaigns = list(fields.campaigns)
        if position is not None:
            row.position = position
        if active is True:
            row.state = State.ACTIVE
            row.failures, row.failing_since, row.next_at = 0, None, None
        elif active is False:
            row.state = State.PAUSED
        if new_secret:
            row.secret = secret_new()
        row.save()
        return row

    saved = WEBHOOKS.write(
        Action.SECRET_ROTATED if new_secret else Action.CHANGED,
        locate=lambda: WebhookEndpoint.objects.select_for_update().get(pk=endpoint.pk),
        change=changed, user=by, via=via,
    )  # fmt: skip
    assert saved is not None
    return saved


def webhook_delete(endpoint: WebhookEndpoint, *, by: Any = None, via: str = "api") -> None:
    """Delete an endpoint (its deliveries with it)."""
    WEBHOOKS.write(Action.DELETED, locate=lambda: endpoint, change=deleted, user=by, via=via)


def webhook_lag(endpoint: WebhookEndpoint) -> int:
    """How many batches of the stream the endpoint is behind (0: caught up)."""
    end = stream_end()
    return max(0, end.batch - position_from_text(endpoint.position).batch)


# --- delivering -----------------------------------------------------------------------------------


def webhooks_due(now: datetime | None = None) -> list[int]:
    """The active endpoints whose delivery is due and that no run holds."""
    now = now or timezone.now()
    return list(
        _due(WebhookEndpoint.objects.all(), now).order_by("id").values_list("id", flat=True)
    )


def _due(endpoints: Any, now: datetime) -> Any:
    """Those of `endpoints` due at `now`: active, not waiting for a retry, held by no run."""
    return endpoints.filter(_ready(now), lease_free(now))


def _ready(now: datetime) -> Q:
    """Endpoints active and not waiting for a retry at `now` (a lookup)."""
    return Q(state=State.ACTIVE) & (Q(next_at__isnull=True) | Q(next_at__lte=now))


@dataclass
class Delivered:
    requests: int = 0  # requests made
    events: int = 0  # events the endpoint took
    failed: bool = False  # the last request failed (the endpoint waits for its retry)


def retry_in(failures: int) -> timedelta:
    """How long an endpoint that failed `failures` times in a row waits before the next try."""
    return timedelta(seconds=min(LONGEST_RETRY, FIRST_RETRY * 2 ** max(0, failures - 1)))


_session: requests.Session | None = None


def _http() -> requests.Session:
    global _session
    if _session is None:
        _session = requests.Session()
    return _session


def webhook_deliver(
    endpoint_id: int,
    *,
    now: datetime | None = None,
    seconds: float = RUN_SECONDS,
    session: requests.Session | None = None,
) -> Delivered | None:
    """Post the endpoint what the stream holds after its position, a batch a request, until it
    has caught up, a request failed, or `seconds` passed. None when it is not due, not active,
    or another run holds it. `now` (tests) is the time its bookkeeping goes by; signatures carry
    the real time, which receivers compare with their clock."""
    now = now or timezone.now()
    lease = RowLease(WebhookEndpoint.objects.filter(pk=endpoint_id), LEASE)
    if not lease.take(now, where=_ready(now)):
        return None
    endpoint = WebhookEndpoint.objects.get(pk=endpoint_id)
    report = Delivered()
    try:
        _deliver(endpoint, lease, report, now=now, seconds=seconds, session=session or _http())
    finally:
        lease.give_back()
    return report


def _filters(endpoint: WebhookEndpoint) -> Filters:
    return Filters(
        types=frozenset(endpoint.types),
        channels=frozenset(endpoint.channels),
        campaigns=frozenset(endpoint.campaigns),
    )


def _deliver(
    endpoint: WebhookEndpoint,
    lease: RowLease,
    report: Delivered,
    *,
    now: datetime,
    seconds: float,
    session: requests.Session,
) -> None:
    filters = _filters(endpoint)
    position = position_from_text(endpoint.position)
    deadline = time.monotonic() + seconds
    while True:
        page = stream_read(position, BATCH, filters)
        if not page.encoded:
            if page.next != position:  # past events its filters drop
                _saved(endpoint, lease, before=position, position=page.next, now=now)
            return
        message_id = f"msg_{endpoint.pk}_{position}_{page.next}"
        body = page.json()
        ok, code, error, took = _post(session, endpoint, message_id, body)
        report.requests += 1
        # The attempt and what it did to the endpoint, in one commit.
        with transaction.atomic():
            WebhookDelivery.objects.create(
                endpoint=endpoint, at=now, message_id=message_id, events=len(page.encoded),
                ok=ok, status_code=code, error=error, milliseconds=took,
            )  # fmt: skip
            if not ok:
                report.failed = True
                _failed(endpoint, now=now, error=error)
                return
            moved = _saved(
                endpoint, lease, before=position, position=page.next,
                delivered=len(page.encoded), now=now,
            )  # fmt: skip
        report.events += len(page.encoded)
        position = page.next
        if not moved or not page.more or time.monotonic() > deadline:
            return


def _post(
    session: requests.Session, endpoint: WebhookEndpoint, message_id: str, body: bytes
) -> tuple[bool, int | None, str, int]:
    """(taken, status code, what went wrong, milliseconds)."""
    timestamp = int(time.time())
    headers = {
        "content-type": "application/json",
        "user-agent": "Gatekeeper-Webhooks/1",
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(endpoint.secret, message_id, timestamp, body),
    }
    started = time.monotonic()
    try:
        answer = session.post(
            endpoint.url, data=body, headers=headers, timeout=TIMEOUT, allow_redirects=False
        )
    except requests.RequestException as exc:
        took = round((time.monotonic() - started) * 1000)
        return False, None, f"{type(exc).__name__}: {exc}"[:500], took
    took = round((time.monotonic() - started) * 1000)
    if 200 <= answer.status_code < 300:
        return True, answer.status_code, "", took
    return False, answer.status_code, f"HTTP {answer.status_code}: {answer.text[:200]}", took


def _saved(
    endpoint: WebhookEndpoint,
    lease: RowLease,
    *,
    before: Position,
    position: Position,
    now: datetime,
    delivered: int = 0,
) -> bool:
    """The endpoint moved on from `before` to `position` (and its lease renewed). False when a
    person moved it meanwhile (PATCH `start`), or the run outlasted its lease and another took
    the endpoint over: theirs stands, and the run stops."""
    endpoint.position = str(position)
    changes: dict[str, Any] = {"position": endpoint.position}
    if delivered:
        endpoint.delivered += delivered
        endpoint.failures, endpoint.failing_since, endpoint.next_at = 0, None, None
        endpoint.last_success_at = now
        changes.update(
            delivered=endpoint.delivered, failures=0, failing_since=None, next_at=None,
            last_success_at=now,
        )  # fmt: skip
    # Only its own fields: a person pausing it meanwhile keeps their change.
    return lease.renew(now, where=Q(position=str(before)), **changes)


def _failed(endpoint: WebhookEndpoint, *, now: datetime, error: str) -> None:
    failures = endpoint.failures + 1
    since = endpoint.failing_since or now
    changes: dict[str, Any] = {
        "failures": failures,
        "failing_since": since,
        "next_at": now + retry_in(failures),
        "last_error": error,
    }
    if now - since >= GIVE_UP_AFTER:
        changes["state"] = State.FAILING
        logger.error("Webhook %s paused: failing since %s (%s)", endpoint.url, since, error)
    else:
        logger.warning("Webhook %s failed (%d in a row): %s", endpoint.url, failures, error)
    WebhookEndpoint.objects.filter(pk=endpoint.pk, state=State.ACTIVE).update(**changes)


def deliveries_prune(now: datetime | None = None) -> int:
    """Forget attempts older than a week. Returns how many."""
    now = now or timezone.now()
    return int(WebhookDelivery.objects.filter(at__lt=now - KEEP_DELIVERIES).delete()[0])


def webhook_shown(endpoint: WebhookEndpoint) -> dict[str, Any]:
    """An endpoint as REST answers it (its secret too: whoever may read endpoints verifies
    their requests)."""
    return {
        "id": endpoint.pk,
        "url": endpoint.url,
        "description": endpoint.description,
        "types": endpoint.types,
        "channels": endpoint.channels,
        "campaigns": endpoint.campaigns,
        "state": endpoint.state,
        "secret": endpoint.secret,
        "position": endpoint.position,
        "delivered": endpoint.delivered,
        "failures": endpoint.failures,
        "failing_since": endpoint.failing_since,
        "next_attempt_at": endpoint.next_at,
        "last_error": endpoint.last_error,
        "last_success_at": endpoint.last_success_at,
        "created_at": endpoint.created_at,
    }


def recent_deliveries(endpoint: WebhookEndpoint, count: int = 20) -> Sequence[WebhookDelivery]:
    return list(endpoint.deliveries.order_by("-id")[:count])
