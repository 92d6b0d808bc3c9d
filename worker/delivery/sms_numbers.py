"""Which users a phone number was texted for. A reply (STOP, START) carries only the number it
came from: the inbound webhook (worker/delivery/twilio_inbound.py) finds its users here.

A chunk run records, once after its sends, every (number, user) of an sms send that went out
or may have (ambiguous): one upsert of a few thousand rows, `last_sent_at` moved on for pairs
already known. A number may belong to several users (a shared phone, an account opened twice,
a number passed on to someone else): a STOP from it is about every one of them, as Twilio
itself then refuses every send to that number (21610)."""

from collections.abc import Iterable
from datetime import datetime

from worker.models import SmsNumber

_BATCH = 1_000  # rows per statement: below every engine's limit on parameters


def sms_numbers_record(*, sends: Iterable[tuple[int, str]], at: datetime) -> None:
    """Remember that each (user id, number) of `sends` was texted at `at`."""
    # Each pair once (PostgreSQL refuses to update one row twice in a statement), in one order:
    # two chunks upserting the same numbers at once then lock their rows in the same order and
    # one waits for the other instead of both deadlocking.
    pairs = sorted({(number, user_id) for user_id, number in sends})
    for start in range(0, len(pairs), _BATCH):
        SmsNumber.objects.bulk_create(
            [
                SmsNumber(number=number, user_id=user_id, last_sent_at=at)
                for number, user_id in pairs[start : start + _BATCH]
            ],
            update_conflicts=True,
            unique_fields=["number", "user_id"],
            update_fields=["last_sent_at"],
        )


def sms_users_of(number: str) -> list[int]:
    """The users `number` was texted for, in id order."""
    return list(
        SmsNumber.objects.filter(number=number)
        .order_by("user_id")
        .values_list("user_id", flat=True)
    )
