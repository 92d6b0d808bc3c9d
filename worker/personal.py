"""The worker's places of personal data (limits.privacy.personal): a send job's recipients (an
address, a message id, the template's context), what rounds chose for them, the dead addresses
providers reported, and the phone numbers an SMS went to. Registered by the app's ready()."""

from typing import Any

from django.db import connection
from django.db.models import Q, TextField
from django.db.models.functions import Cast
from rest_framework import serializers

from limits.privacy.personal import Erased, Place, place_register, rows_deleted
from worker.chunks import chunk_withdraw
from worker.models import DeadAddress, RoundEntry, SendChunk, SendJob, SmsNumber
from worker.round_entries import round_entries_erase, round_entries_of


def chunks_holding(user_id: int) -> list[SendChunk]:
    """The chunks whose recipients name `user_id`, oldest first. PostgreSQL finds them by JSON
    containment; elsewhere the stored text is searched for the id, then read."""
    chunks = SendChunk.objects.select_related("job").order_by("pk")
    if connection.vendor == "postgresql":
        return list(chunks.filter(recipients__contains=[{"user_id": user_id}]))
    text = chunks.annotate(text=Cast("recipients", TextField()))
    needle = f'"user_id":{user_id}'
    found = text.filter(Q(text__contains=f"{needle},") | Q(text__contains=f"{needle}}}"))
    return [chunk for chunk in found if any(r["user_id"] == user_id for r in chunk.recipients)]


def _recipients(user_id: int) -> list[dict[str, Any]]:
    """The user's recipient records in send jobs, each with its job and what became of it
    (a chunk queued or waiting: not sent yet)."""
    out = []
    for chunk in chunks_holding(user_id):
        job = chunk.job
        for row in chunk.recipients:
            if row["user_id"] != user_id:
                continue
            out.append(
                {
                    "job": job.pk,
                    "campaign": job.campaign,
                    "channel": job.channel,
                    "job_status": job.status,
                    "pending": chunk.status in (SendChunk.Status.QUEUED, SendChunk.Status.STAGED),
                    "waiting_until": chunk.not_before,
                    "address": row["address"],
                    "message_id": row["message_id"],
                    "context": row.get("context") or {},
                    "time_zone": row.get("time_zone"),
                }
            )
    return out


def _recipients_erase(user_ids: list[int]) -> Erased:
    """Every chunk is read once (an erasure's ids at a time), and those naming any of them
    withdrawn from (worker.chunks.chunk_withdraw). Waits while a campaign file is being read."""
    wanted = set(user_ids)
    removed = waiting = 0
    # A campaign file being read stages its records as it goes: the erasure waits for it (the
    # gate refuses them meanwhile), so that none is staged after its last pass.
    waiting += SendJob.objects.filter(status=SendJob.Status.PREPARING).count()
    rows = SendChunk.objects.order_by("pk").values_list("pk", "recipients")
    hits = [
        pk
        for pk, recipients in rows.iterator(chunk_size=200)
        if any(r["user_id"] in wanted for r in recipients)
    ]
    for pk in hits:
        done, left = chunk_withdraw(pk, wanted)
        removed, waiting = removed + done, waiting + left
    return Erased(removed, waiting)


def _dead_addresses(user_id: int) -> list[dict[str, Any]]:
    rows = DeadAddress.objects.filter(user_id=user_id).order_by("-at", "-pk")
    return [
        {"job": row.job_id, "address": row.address, "reason": row.reason, "at": row.at}
        for row in rows
    ]


def _sms_numbers(user_id: int) -> list[dict[str, Any]]:
    rows = SmsNumber.objects.filter(user_id=user_id).order_by("-last_sent_at", "number")
    return [{"number": row.number, "last_sent_at": row.last_sent_at} for row in rows]


class ExportRecipientSerializer(serializers.Serializer):
    job = serializers.IntegerField()
    campaign = serializers.CharField(allow_blank=True)
    channel = serializers.CharField()
    job_status = serializers.CharField()
    pending = serializers.BooleanField(help_text="Not sent yet: its chunk is queued or staged.")
    waiting_until = serializers.DateTimeField(
        allow_null=True, help_text="A send the gate deferred: when it is tried again."
    )
    address = serializers.CharField()
    message_id = serializers.CharField()
    context = serializers.DictField(  # type: ignore[assignment]  # a field named context
        help_text="What the template reads for them."
    )
    time_zone = serializers.CharField(allow_null=True)


class ExportDeadAddressSerializer(serializers.Serializer):
    job = serializers.IntegerField()
    address = serializers.CharField()
    reason = serializers.CharField(help_text="What the provider said.")
    at = serializers.DateTimeField()


class ExportRoundSerializer(serializers.Serializer):
    round = serializers.IntegerField()
    job = serializers.IntegerField()
    chosen = serializers.BooleanField(help_text="The round chose this job's send to them.")
    outranked_by = serializers.DictField(
        allow_null=True,
        help_text="Not chosen: the job that won their slot and what its send was worth to them.",
    )


class ExportSmsNumberSerializer(serializers.Serializer):
    number = serializers.CharField(help_text="E.164.")
    last_sent_at = serializers.DateTimeField()


def places_register() -> None:
    for place in (
        Place(
            "send_jobs",
            "Their recipient records in send jobs (address, message id, the template's context, "
            "time zone), each with its job, whether it is still to be sent and until when it "
            "waits.",
            _recipients,
            lambda: ExportRecipientSerializer(many=True),
            (SendChunk,),
            _recipients_erase,
        ),
        Place(
            "dead_addresses",
            "Addresses or push tokens a provider said are dead, with what it said.",
            _dead_addresses,
            lambda: ExportDeadAddressSerializer(many=True),
            (DeadAddress,),
            rows_deleted(DeadAddress),
        ),
        Place(
            "rounds",
            "What rounds chose for them among competing send jobs: per job, chosen, or outranked "
            "by which job and what its send was worth to them.",
            round_entries_of,
            lambda: ExportRoundSerializer(many=True),
            (RoundEntry,),
            lambda user_ids: Erased(round_entries_erase(user_ids)),
        ),
        Place(
            "sms_numbers",
            "The phone numbers texts went to (a reply such as STOP names only the number).",
            _sms_numbers,
            lambda: ExportSmsNumberSerializer(many=True),
            (SmsNumber,),
            rows_deleted(SmsNumber),
        ),
    ):
        place_register(place)
