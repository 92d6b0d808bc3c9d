"""A person's data put in every place by the real parts (the gate, the ledger drained, the
suppression list, preferences over REST, a quota reset, a scheduled send job's staged
recipients, a dead address, an SMS number, a study): what a person's export reads and an
erasure removes."""

from datetime import UTC, datetime, timedelta

from limits.ledger.drain import ledger_drain_all
from limits.models.ledger import LedgerEntry
from limits.models.studies import StudyMember
from limits.people.suppression import suppress, unsuppress
from limits.policy.services import quota_reset
from tests.support.api import call
from worker.gate import gate_check
from worker.models import DeadAddress, SendJob, SmsNumber

ADDRESS = "one@example.com"
NUMBER = "+15550100"


def person_everywhere(session, user_id: int, *, others: tuple[int, ...], now: datetime) -> SendJob:
    """`user_id`'s data in every place, `others` beside them in some (the ledger, the
    suppression list, the job); `session` a campaign system's. Returns the scheduled job."""
    other = others[0]
    gate_check(
        channel="email", requests=[(user_id, f"welcome:{user_id}"), (other, f"welcome:{other}")],
        now=now - timedelta(seconds=60),
    )  # fmt: skip
    gate_check(
        channel="push",
        requests=[(user_id, f"promo:{user_id}")],
        campaign="spring",
        tags=("promo",),
        now=now,
    )
    ledger_drain_all()
    LedgerEntry.objects.filter(message_id=f"promo:{user_id}").update(outcome="sent")
    suppress(
        channel="sms", user_ids=[user_id, other], reason="complained", source="test", note="asked"
    )
    suppress(channel="push", user_ids=[user_id], reason="unsubscribed", source="test")
    unsuppress(channel="push", user_ids=[user_id], source="test")
    prefs = {
        "channels": {"push": False},
        "frequency": [{"channel": "email", "window": {"kind": "calendar", "unit": "day"}, "limit": 2}],
    }  # fmt: skip
    put = call(session, "PUT", f"/api/v1/users/{user_id}/preferences/", json=prefs)
    assert put.status_code == 200, put.text
    quota_reset(user_id=user_id, reason="support ticket 12")
    StudyMember.objects.create(study=0, user_id=user_id, arm=1, bucket=5, entered="2026-11-20")
    start = datetime.now(UTC) + timedelta(hours=3)
    recipients = [{"user_id": user_id, "address": ADDRESS, "context": {"name": "Ana"}}]
    recipients += [{"user_id": u, "address": f"u{u}@example.com"} for u in others]
    created = call(
        session,
        "POST",
        "/api/v1/sends/",
        json={
            "channel": "email",
            "campaign": "launch",
            "template": "welcome",
            "start_at": start.isoformat(),
            "recipients": recipients,
        },
    )
    assert created.status_code == 202, created.text
    job = SendJob.objects.get(pk=created.json()["id"])
    DeadAddress.objects.create(
        job=job, user_id=user_id, address="old@example.com", reason="550 gone"
    )
    SmsNumber.objects.create(number=NUMBER, user_id=user_id, last_sent_at=datetime.now(UTC))
    return job
