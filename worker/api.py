"""REST views of the gate (check, release), of send jobs (hand over, read, edit or
reschedule before they start, join or leave a round, start early, pause, resume, cancel, their
waiting sends) and of rounds (make, read, edit while open, cancel)."""

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, cast

import msgspec
from django.conf import settings
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.parsers import MultiPartParser
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings

from gatekeeper.lib.api import JsonAPIView, errors
from gatekeeper.lib.bodies import JsonBodyParser, declared_size_checked, decode
from gatekeeper.lib.conflicts import Conflict
from gatekeeper.lib.ids import DATABASE_MAX, user_ids_checked
from gatekeeper.lib.permissions import (
    CANCEL_SENDS,
    GATE,
    RUN_BACKTESTS,
    VIEW_BACKTESTS,
    VIEW_SEND_JOBS,
)
from gatekeeper.lib.zones import time_zone_checked
from limits.channels import validate_channel
from limits.engine.limiter import Decision
from limits.ledger.api import CsvRenderer, CsvReportView, interval_parameters
from limits.ledger.history import interval_from_text
from limits.policy.bodies import tags_checked
from limits.policy.quota import Unavailable
from limits.reasons import MARKETING_REASONS
from segments.index import max_answerable_user_id
from worker.bodies import (
    FILE_PART,
    GATE_BODY_BYTES,
    GATE_LIMIT,
    SEND_BODY_BYTES,
    SEND_LIMIT,
    BacktestBody,
    GateCheckBody,
    GateReleaseBody,
    GateRequest,
    RoundBody,
    RoundCancelBody,
    RoundChangeBody,
    RoundProjectionBody,
    SendJobBody,
    SendJobChangeBody,
    form_fields,
)
from worker.gate import gate_check, gate_release
from worker.models import Backtest, Round, SendJob
from worker.plan import plan_later_counted
from worker.round_services import (
    round_cancel,
    round_create,
    round_edit,
    round_projection_ask,
)
from worker.serializers import (
    BacktestSerializer,
    GateResultsSerializer,
    JobPlanSerializer,
    PlanSerializer,
    ReleaseResultsSerializer,
    RoundListSerializer,
    RoundReportSerializer,
    RoundSerializer,
    SendJobCreatedSerializer,
    SendJobSerializer,
)
from worker.services import (
    EDITABLE,
    backtest_create,
    plan_current,
    send_job_cancel,
    send_job_cancel_waiting,
    send_job_create,
    send_job_edit,
    send_job_from_file,
    send_job_pause,
    send_job_resume,
    send_job_start,
)


def gate_requests(requests: list[GateRequest]) -> list[tuple[int, str]]:
    """A gate body's requests as (user id, message id), each id within the widest the loaded
    snapshot answers; a 400 naming the first that is not (`requests[3].user_id`)."""
    ids = user_ids_checked(
        [r.user_id for r in requests],
        field="requests",
        item="user_id",
        maximum=max_answerable_user_id(),
    )
    return list(zip(ids, [r.message_id for r in requests], strict=True))


def _time_zones(requests: list[GateRequest]) -> list[str | None] | None:
    """Each request's time zone (None: not given), or None when no request gives one; a 400
    naming the first unknown one (`requests[3].time_zone`)."""
    zones = [r.time_zone for r in requests]
    if all(name is None for name in zones):
        return None
    known: set[str] = set()  # 10,000 requests in a few zones cost a few lookups
    for i, name in enumerate(zones):
        if name is not None and name not in known:
            time_zone_checked(name, field=f"requests[{i}].time_zone")
            known.add(name)
    return zones


def _decision(d: Decision) -> dict[str, Any]:
    # By hand rather than dataclasses.asdict, which deep-copies: 10,000 of these per request.
    return {
        "user_id": d.user_id,
        "message_id": d.message_id,
        "segment": d.segment,
        "allowed": d.allowed,
        "reason": d.reason,
        "counts": d.counts,
        "limits": d.limits,
        "rule": d.rule,
        "reserved": d.reserved,
        "reserved_for": d.reserved_for,
        "preference": d.preference,
        "experiment": d.experiment,
        "retry_after": d.retry_after,
    }


class GateCheckView(JsonAPIView):
    rights = {"POST": GATE}
    bodies = {"POST": GateCheckBody}
    operation_ids = {"POST": "gate_check"}
    max_body_bytes = GATE_BODY_BYTES
    body_limit_reason = f"{GATE_LIMIT:,} requests"

    @extend_schema(
        summary=f"Decide a batch of sends (at most {GATE_LIMIT:,}), in request order",
        description=(
            "Every enabled rule that applies to a send must have room (its segment's and every "
            "segment's; its channel's and `all`; every send, its tags, its campaign); a refusal "
            "names the rule that decided it. Admitted marketing sends are recorded (unless "
            "dry_run). Redis down or no snapshot: every decision is `unavailable`, still a 200."
        ),
        responses={200: GateResultsSerializer, **errors(400, 413)},
    )
    def post(self, request: Request) -> Response:
        body = decode(request.data, GateCheckBody)
        validate_channel(body.channel, field="channel")
        tags = tags_checked(body.tags)
        requests = gate_requests(body.requests)
        time_zones = _time_zones(body.requests)
        decisions = gate_check(
            channel=body.channel,
            requests=requests,
            campaign=body.campaign,
            category=body.category,
            tags=tags,
            priority=body.priority,
            time_zones=time_zones,
            dry_run=body.dry_run,
            topic=body.topic or "",
        )
        return Response({"results": [_decision(d) for d in decisions]})


class GateReleaseView(JsonAPIView):
    rights = {"POST": GATE}
    bodies = {"POST": GateReleaseBody}
    operation_ids = {"POST": "gate_release"}
    max_body_bytes = GATE_BODY_BYTES
    body_limit_reason = f"{GATE_LIMIT:,} requests"

    @extend_schema(
        summary="Give back the quota of sends whose dispatch failed for good",
        responses={200: ReleaseResultsSerializer, **errors(400, 413)},
    )
    def post(self, request: Request) -> Response:
        body = decode(request.data, GateReleaseBody)
        validate_channel(body.channel, field="channel")
        requests = gate_requests(body.requests)
        # A send is taken back by its message id alone; a time zone the request still carries
        # (the requests as checked) is held to the same rule, not ignored.
        _time_zones(body.requests)
        released = gate_release(channel=body.channel, requests=requests)
        return Response(
            {
                "results": [
                    {"user_id": u, "message_id": m, "released": r}
                    for (u, m), r in zip(requests, released, strict=True)
                ]
            }
        )


class SendFileParser(MultiPartParser):
    """multipart/form-data for a campaign file: refused (413) from its Content-Length beyond
    GATEKEEPER_SEND_FILE_MAX_UPLOAD_BYTES; Django streams the file to a temporary file."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        declared_size_checked(
            (parser_context or {}).get("request"),
            limit=int(settings.GATEKEEPER_SEND_FILE_MAX_UPLOAD_BYTES),
            reason="GATEKEEPER_SEND_FILE_MAX_UPLOAD_BYTES",
        )
        return super().parse(stream, media_type, parser_context)


class SendJobListView(JsonAPIView):
    rights = {"POST": GATE}
    bodies = {"POST": SendJobBody}
    operation_ids = {"POST": "send_job_create"}
    parser_classes = [JsonBodyParser, SendFileParser]
    max_body_bytes = SEND_BODY_BYTES
    body_limit_reason = f"{SEND_LIMIT:,} recipients"

    @extend_schema(
        summary="Hand a send job to the worker: its recipients listed, or a file; 202, its URL",
        description=(
            f"Up to {SEND_LIMIT:,} recipients listed in the JSON body (`recipients`), checked "
            "before the answer. More go in a campaign file (CSV `user_id,address[,time_zone]"
            "[,context]`, plain or gzip, any length): uploaded as multipart/form-data (the "
            f"file in the part `{FILE_PART}`, the other fields as form fields; tags comma "
            "separated; left out of this schema's request bodies, which generated clients could "
            "not take beside the JSON one), or named by `recipients_key`, an object in the configured store. A "
            "file's first lines are checked before the answer (a 400 names the line); the job "
            "is then `preparing` while the worker reads the rest in the background (`progress` "
            "is the share read), and what it has read is sent meanwhile, in file order. A bad "
            "line found then fails the job with the line named in `error` and `invalid_rows`: "
            "nothing after it is sent, and what was handed out and had not gone out yet is "
            "cancelled. Every send of a file has the message id <campaign>:<user_id>."
        ),
        responses={202: SendJobCreatedSerializer, **errors(400, 413, 503)},
    )
    def post(self, request: Request) -> Response:
        upload = None
        if isinstance(request.data, bytes | bytearray):
            body = decode(request.data, SendJobBody)
        else:
            upload = request.FILES.get(FILE_PART)
            if upload is None:
                raise ValidationError({FILE_PART: ["Attach the recipients file in this part."]})
            body = decode(
                msgspec.json.encode(form_fields(request.data, request.FILES)), SendJobBody
            )
        given = [body.recipients is not None, body.recipients_key is not None, upload is not None]
        if sum(given) != 1:
            raise ValidationError(
                {
                    "recipients": [
                        "Give the recipients once: `recipients` (a list), `recipients_key` (a "
                        f"file in the store), or an uploaded file (`{FILE_PART}`)."
                    ]
                }
            )
        job_fields: dict[str, Any] = {
            "channel": body.channel,
            "campaign": body.campaign,
            "template": body.template,
            "category": body.category,
            "tags": tags_checked(body.tags),
            "priority": body.priority,
            "topic": body.topic or "",
            "on_capped": body.on_capped,
            "on_invalid": body.on_invalid,
            "expires_at": body.expires_at,
            "start_at": body.start_at,
            "reserve": body.reserve,
            "round": body.round,
            "value": body.value,
            "user": request.user,
        }
        try:
            if body.recipients is not None:
                # The service checks every row: an unknown time zone is that row's error,
                # refusing the job or skipping the row as on_invalid says.
                job = send_job_create(recipients=msgspec.to_builtins(body.recipients), **job_fields)
            else:
                job = send_job_from_file(
                    fileobj=upload,
                    name=upload.name if upload is not None else "",
                    key=body.recipients_key,
                    **job_fields,
                )
        except Unavailable as exc:
            return Response({"detail": str(exc)}, status=503)
        answer = SendJobSerializer(job).data
        url = request.build_absolute_uri(f"/api/v1/sends/{job.pk}/")
        return Response({**answer, "url": url}, status=202, headers={"Location": url})


class SendJobDetailView(JsonAPIView):
    rights = {"GET": VIEW_SEND_JOBS, "PATCH": GATE}
    bodies = {"PATCH": SendJobChangeBody}
    operation_ids = {"GET": "send_job_get", "PATCH": "send_job_edit"}

    @extend_schema(
        summary="A send job's progress and counts",
        responses={200: SendJobSerializer, **errors(404)},
    )
    def get(self, request: Request, job_id: int) -> Response:
        return Response(SendJobSerializer(get_object_or_404(SendJob, pk=job_id)).data)

    @extend_schema(
        summary="Edit or reschedule a job that has not started; the job, as it is now",
        description=(
            "Until a scheduled job starts (`status` scheduled, or preparing with a start_at "
            f"ahead), its {', '.join(EDITABLE)} can change, each checked as at creation (a 400 "
            "names the field). A new start_at "
            "moves expires_at by as much unless it is given too. Its recipients, channel and "
            "campaign cannot (cancel it and hand over another). `round` joins an open round (the "
            "start moves to its send_at) or, null, leaves it (the job stays scheduled at its "
            "start); `value` changes its value there: while the round is open and before it "
            "closes (409 otherwise, as for any change of a job whose round has closed). A job "
            "in a round starts at its send_at: another start_at is a 400. A 409 once it has "
            "started."
        ),
        responses={200: SendJobSerializer, **errors(400, 404, 409)},
    )
    def patch(self, request: Request, job_id: int) -> Response:
        body = decode(request.data, SendJobChangeBody)
        job = get_object_or_404(SendJob, pk=job_id)
        changes: dict[str, Any] = {
            name: getattr(body, name)
            for name in body.__struct_fields__
            if getattr(body, name) is not msgspec.UNSET
        }
        if "tags" in changes:
            changes["tags"] = list(tags_checked(changes["tags"]))
        if "topic" in changes:
            changes["topic"] = changes["topic"] or ""
        job = send_job_edit(job=job, changes=changes, user=request.user)
        return Response(SendJobSerializer(job).data)


class SendJobWaitingView(JsonAPIView):
    rights = {"DELETE": CANCEL_SENDS}
    operation_ids = {"DELETE": "send_job_cancel_waiting"}

    @extend_schema(
        summary="Cancel a send job's waiting sends; the job, as it is now",
        description=(
            "Every send the gate deferred (caps, quiet hours) that waits for its release counts "
            "as `cancelled`, and so does every send the job defers from now on. Sends being "
            "gated or sent at this moment are not waiting and go on. Idempotent: 200 with the "
            "job every time."
        ),
        responses={200: SendJobSerializer, **errors(404)},
    )
    def delete(self, request: Request, job_id: int) -> Response:
        job = get_object_or_404(SendJob, pk=job_id)
        job = send_job_cancel_waiting(job=job, user=request.user)
        return Response(SendJobSerializer(job).data)


_CONTROLS = {
    "pause": (
        send_job_pause,
        "Pause a send job",
        "No chunk of it is handed out until it is resumed; a chunk being gated or sent at this "
        "moment finishes. A job still being read is read to the end, then waits. Waiting sends "
        "still expire at the job's expiry. Idempotent.",
    ),
    "resume": (
        send_job_resume,
        "Resume a paused send job",
        "Its chunks are handed out again. Idempotent.",
    ),
    "start": (
        send_job_start,
        "Start a scheduled send job now",
        "Its chunks are handed out at once instead of at its start_at. A 409 for a job that is "
        "not scheduled (started, cancelled, or its file still being read), or is in a round "
        "(it starts at the round's send_at: leave the round first).",
    ),
    "cancel": (
        send_job_cancel,
        "Cancel a send job",
        "Nothing more of it goes out: its queued and waiting sends count as `cancelled`; a "
        "chunk being gated or sent at this moment finishes. A job still being read stops. The "
        "job is `cancelled` once every send has its outcome. Idempotent; a 409 for a job that "
        "is done or failed.",
    ),
}


def _control_view(action: str) -> type[JsonAPIView]:
    service, summary, description = _CONTROLS[action]

    class ControlView(JsonAPIView):
        rights = {"POST": CANCEL_SENDS}
        operation_ids = {"POST": f"send_job_{action}"}

        @extend_schema(
            summary=f"{summary}; the job, as it is now",
            description=description,
            request=None,
            responses={200: SendJobSerializer, **errors(404, 409)},
        )
        def post(self, request: Request, job_id: int) -> Response:
            job = get_object_or_404(SendJob, pk=job_id)
            return Response(SendJobSerializer(service(job=job, user=request.user)).data)

    ControlView.__name__ = ControlView.__qualname__ = f"SendJob{action.title()}View"
    return ControlView


SendJobPauseView = _control_view("pause")
SendJobResumeView = _control_view("resume")
SendJobStartView = _control_view("start")
SendJobCancelView = _control_view("cancel")


class PlanView(JsonAPIView):
    rights = {"GET": VIEW_SEND_JOBS}
    operation_ids = {"GET": "plan_get"}

    @extend_schema(
        summary="The forward plan: per scheduled job, what the gate will decide when it starts",
        description=(
            "Per scheduled job starting in ?from= to ?to= (each a UTC day or an instant with its "
            "offset; either may be left out), in the order they start: recipients predicted "
            "sent, refused (by reason and by rule), held by quiet hours, and the earlier jobs "
            "that take the slots it needed, with the first users who lose one. A prediction is "
            "the gate's own decision at the job's start_at on a copy of the users' logs, "
            "counting the sends of every job that starts before it, assuming nothing else is "
            "sent in between (docs/worker.md, 'The plan'). The plan is made in the background "
            "whenever a job, a rule or the snapshot changes: `stale` says a newer one is being "
            "made."
        ),
        parameters=[
            *interval_parameters("Jobs starting"),
            OpenApiParameter(
                "later",
                {"type": "string", "enum": ["counted"]},
                description="counted: each job also counts the sends of the later jobs of "
                "higher priority that will take its users' slots (as if every job were "
                "reserved), made while you wait, up to 200,000 recipients in all (400 beyond).",
            ),
        ],
        responses={200: PlanSerializer, **errors(400)},
    )
    def get(self, request: Request) -> Response:
        since, until = interval_from_text(
            request.query_params.get("from"), request.query_params.get("to")
        )
        later = request.query_params.get("later")
        if later not in (None, "counted"):
            raise ValidationError({"later": [f"Unknown value '{later[:40]}'. Only: counted."]})
        answer = plan_current()
        answer.pop("overlaps")  # the admin page's, not in the API's answer
        if later == "counted":
            try:
                answer["jobs"] = plan_later_counted()
            except ValueError as exc:
                raise ValidationError({"later": [str(exc)]}) from None
        answer["jobs"] = [
            job
            for job in answer["jobs"]
            if (since is None or datetime.fromisoformat(job["start_at"]) >= since)
            and (until is None or datetime.fromisoformat(job["start_at"]) < until)
        ]
        return Response(answer)


class SendJobPlanView(JsonAPIView):
    rights = {"GET": VIEW_SEND_JOBS}
    operation_ids = {"GET": "send_job_plan"}

    @extend_schema(
        summary="A scheduled job's part of the forward plan",
        description="As in GET /api/v1/plan/, for one job; 404 when it is not in the plan "
        "(not scheduled, or scheduled after the plan was made: see `stale`).",
        responses={200: JobPlanSerializer, **errors(404)},
    )
    def get(self, request: Request, job_id: int) -> Response:
        job = get_object_or_404(SendJob, pk=job_id)
        if job.status != SendJob.Status.SCHEDULED:
            why = f"it is not scheduled (it is {job.status})"
        else:
            for planned in plan_current()["jobs"]:
                if planned["job"] == job.pk:
                    return Response(planned)
            why = "the plan is being made again with it; ask again in a while"
        return Response({"detail": f"Send job {job.pk} is not in the plan: {why}."}, status=404)


# --- backtests --------------------------------------------------------------------------------


def backtest_shown(backtest: Backtest, request: Request) -> dict[str, Any]:
    done = sum(part.done for part in backtest.part_rows.all())
    finished = backtest.status == Backtest.Status.DONE
    fraction = (
        1.0 if finished else min(0.99, done / backtest.expected) if backtest.expected else 0.0
    )
    return {
        "id": backtest.pk,
        "url": request.build_absolute_uri(f"/api/v1/backtests/{backtest.pk}/"),
        "from": backtest.start,
        "to": backtest.end,
        "changes": backtest.changes,
        "status": backtest.status,
        "parts": backtest.parts,
        "progress": {"decisions": done, "expected": backtest.expected, "fraction": fraction},
        "partial": backtest.partial or None,
        "error": backtest.error or None,
        "created_at": backtest.created_at,
        "finished_at": backtest.finished_at,
        "result": backtest.result,
    }


class BacktestCsvRenderer(CsvRenderer):
    """A backtest's rows: per day x segment x channel x campaign, the sends gained and lost,
    users affected, the decisions by reason under each policy, and the rules in words."""

    def table(self, data: Any) -> tuple[list[str], Iterable[Mapping[str, Any]]]:
        reasons = [r.value for r in MARKETING_REASONS]
        columns = [
            "day", "segment", "channel", "campaign", "gained", "lost", "users_affected",
            *(f"in_force_{r}" for r in reasons), *(f"draft_{r}" for r in reasons), "rules",
        ]  # fmt: skip
        rows = (
            {
                **{key: row[key] for key in columns[:7]},
                **{f"in_force_{r}": row["in_force"].get(r, 0) for r in reasons},
                **{f"draft_{r}": row["draft"].get(r, 0) for r in reasons},
                "rules": "; ".join(
                    f"{rule['name']}: +{rule['gained']} -{rule['lost']}" for rule in row["rules"]
                ),
            }
            for row in (data.get("result") or {}).get("rows", [])
        )
        return columns, rows


BACKTEST_ID = OpenApiParameter(
    "backtest_id",
    {"type": "integer", "minimum": 1, "maximum": DATABASE_MAX},
    OpenApiParameter.PATH,
    description="The backtest's id.",
)


class BacktestListView(JsonAPIView):
    rights = {"POST": RUN_BACKTESTS}
    bodies = {"POST": BacktestBody}
    operation_ids = {"POST": "backtest_create"}

    @extend_schema(
        summary="Replay a draft of the policy on the ledger's days (202, then poll its url)",
        description=(
            "The period's marketing requests, from the ledger, replayed in time order under the "
            "policy in force and under the draft (rules, quiet hours and classic caps added, "
            "changed or deleted), from the users' logs as they stood at `from`, by the decision "
            "model; as a job in parts (Celery, split by user id) with its progress. Every "
            "change of the draft is checked as saving it would check it: a 400 names the field "
            "(`changes.rules[0].limit`). A period outside the ledger's days is a 400; one the "
            "ledger only partly holds says so (`partial`). docs/backtests.md."
        ),
        responses={202: BacktestSerializer, **errors(400, 413)},
    )
    def post(self, request: Request) -> Response:
        body = decode(request.data, BacktestBody)
        backtest = backtest_create(
            start=body.start, end=body.end, changes=body.changes, user=request.user
        )
        shown = backtest_shown(backtest, request)
        return Response(
            BacktestSerializer(shown).data, status=202, headers={"Location": shown["url"]}
        )


class BacktestDetailView(CsvReportView):
    rights = {"GET": VIEW_BACKTESTS}
    operation_ids = {"GET": "backtest_get"}
    renderer_classes = [
        *cast(Sequence[type[BaseRenderer]], api_settings.DEFAULT_RENDERER_CLASSES),
        BacktestCsvRenderer,
    ]
    csv_renderer = BacktestCsvRenderer

    @extend_schema(
        summary="A backtest: its progress, and its result once done",
        description=(
            "The result, per UTC day x segment x channel x campaign: decisions by reason under "
            "the policy in force and under the draft, sends gained and lost, users affected and "
            "the rules that made the difference; `reproduced` counts the decisions of the policy "
            "in force replayed that differ from the ledger's (0 unless the policy changed during "
            "the period). As CSV with `?format=csv` or `Accept: text/csv` (409 until done)."
        ),
        parameters=[
            BACKTEST_ID,
            OpenApiParameter("format", {"type": "string", "enum": ["json", "csv"]}),
        ],
        responses={
            (200, "application/json"): OpenApiResponse(BacktestSerializer),
            (200, "text/csv"): OpenApiResponse(OpenApiTypes.STR, description="Rows as CSV."),
            **{(code, "application/json"): error for code, error in errors(400, 404, 409).items()},
        },
    )
    def get(self, request: Request, backtest_id: int) -> Response:
        backtest = (
            Backtest.objects.filter(pk=backtest_id).first() if backtest_id <= DATABASE_MAX else None
        )
        if backtest is None:
            raise NotFound(f"No backtest {backtest_id}.")
        shown = backtest_shown(backtest, request)
        if self.as_csv(request):
            if backtest.status != Backtest.Status.DONE:
                raise Conflict(f"Backtest {backtest.pk} is {backtest.status}: no rows yet.")
            response = Response(shown)
            name = f"backtest-{backtest.pk}-{backtest.start}-{backtest.end}.csv"
            response["Content-Disposition"] = f'attachment; filename="{name}"'
            return response
        return Response(BacktestSerializer(shown).data)


# --- rounds -------------------------------------------------------------------------------------


ROUND_ID = OpenApiParameter(
    "round_id",
    {"type": "integer", "minimum": 1, "maximum": DATABASE_MAX},
    OpenApiParameter.PATH,
    description="The round's id.",
)


def _round(round_id: int) -> Round:
    found = Round.objects.filter(pk=round_id).first() if round_id <= DATABASE_MAX else None
    if found is None:
        raise NotFound(f"No round {round_id}.")
    return found


def round_shown(round_: Round, request: Request, *, jobs: bool = False) -> dict[str, Any]:
    """A round as the API answers it; with `jobs`, its jobs and its report (the decision's,
    passed through as worker/rounds.py wrote it; null until decided)."""
    joined = list(
        round_.jobs.order_by("created_at", "pk").values(
            "id", "campaign", "channel", "status", "priority", "value", "total", "created_at"
        )
    )
    shown: dict[str, Any] = {
        "id": round_.pk,
        "url": request.build_absolute_uri(f"/api/v1/rounds/{round_.pk}/"),
        "name": round_.name,
        "channel": round_.channel,
        "closes_at": round_.closes_at,
        "send_at": round_.send_at,
        "status": round_.status,
        "job_count": len(joined),
        "created_at": round_.created_at,
        "decided_at": round_.decided_at,
        "cancelled_at": round_.cancelled_at,
    }
    if jobs:
        shown["jobs"] = joined
        shown["report"] = round_.report if round_.status == Round.Status.DECIDED else None
    return shown


class RoundListView(JsonAPIView):
    rights = {"GET": VIEW_SEND_JOBS, "POST": GATE}
    bodies = {"POST": RoundBody}
    operation_ids = {"GET": "round_list", "POST": "round_create"}

    @extend_schema(
        summary="Every round, newest close first",
        responses={200: RoundListSerializer},
    )
    def get(self, request: Request) -> Response:
        rounds = Round.objects.prefetch_related("jobs").order_by("-closes_at", "-id")
        return Response(
            RoundListSerializer({"results": [round_shown(r, request) for r in rounds]}).data
        )

    @extend_schema(
        summary="Make a round: send jobs join it until it closes, and are decided by value",
        description=(
            "Jobs join it (POST or PATCH /api/v1/sends/ with `round` and `value`) until "
            "closes_at; then each user gets, among the round's sends for them, the set of "
            "highest total value that fits every rule at send_at, and the others are refused "
            "as `outranked`. closes_at: in the future, at most 90 days ahead; send_at: at or "
            "after it (default: closes_at). A 400 names a bad field (an unknown channel: "
            "`channel`)."
        ),
        responses={201: RoundSerializer, **errors(400)},
    )
    def post(self, request: Request) -> Response:
        body = decode(request.data, RoundBody)
        made = round_create(
            name=body.name,
            channel=body.channel,
            closes_at=body.closes_at,
            send_at=body.send_at,
            user=request.user,
        )
        shown = round_shown(made, request)
        return Response(RoundSerializer(shown).data, status=201, headers={"Location": shown["url"]})


class RoundDetailView(JsonAPIView):
    rights = {"GET": VIEW_SEND_JOBS, "PATCH": GATE}
    bodies = {"PATCH": RoundChangeBody}
    operation_ids = {"GET": "round_get", "PATCH": "round_edit"}

    @extend_schema(
        summary="A round, its jobs and, once decided, its report",
        parameters=[ROUND_ID],
        responses={200: RoundSerializer, **errors(404)},
    )
    def get(self, request: Request, round_id: int) -> Response:
        return Response(RoundSerializer(round_shown(_round(round_id), request, jobs=True)).data)

    @extend_schema(
        summary="Change an open round's name, closes_at or send_at; the round, as it is now",
        description=(
            "Checked whole as at creation (a 400 names the field, nothing changes). A send_at "
            "that followed closes_at follows it again unless given. A moved send_at moves every "
            "joined job's start_at to it (and its expires_at by as much). A 409 once the round "
            "is not open or has closed."
        ),
        parameters=[ROUND_ID],
        responses={200: RoundSerializer, **errors(400, 404, 409)},
    )
    def patch(self, request: Request, round_id: int) -> Response:
        body = decode(request.data, RoundChangeBody)
        changes = {
            name: getattr(body, name)
            for name in body.__struct_fields__
            if getattr(body, name) is not msgspec.UNSET
        }
        edited = round_edit(round_=_round(round_id), changes=changes, user=request.user)
        return Response(RoundSerializer(round_shown(edited, request, jobs=True)).data)


class RoundReportView(JsonAPIView):
    rights = {"GET": VIEW_SEND_JOBS, "POST": GATE}
    bodies = {"POST": RoundProjectionBody}
    operation_ids = {"GET": "round_report", "POST": "round_project"}

    @extend_schema(
        summary="A round's report once decided; before, its projection as last asked",
        description=(
            "Per job: candidates, those that fit alone, won, outranked and by which jobs, the "
            "value won, and what first come, first served would have won on the same "
            "candidates; the round's totals and the gain of deciding by value."
        ),
        parameters=[ROUND_ID],
        responses={200: RoundReportSerializer, **errors(404)},
    )
    def get(self, request: Request, round_id: int) -> Response:
        return Response(RoundReportSerializer(_report_shown(_round(round_id))).data)

    @extend_schema(
        summary="Project an open round: what it would choose now (202; GET this URL for it)",
        description=(
            "Computed in the background with the logs as they are, `values` tried instead of "
            "those jobs' own; nothing is decided or changed. A 400 names `values` for a job not "
            "in the round or a value below 0; a 409 once the round is not open."
        ),
        parameters=[ROUND_ID],
        responses={202: RoundReportSerializer, **errors(400, 404, 409)},
    )
    def post(self, request: Request, round_id: int) -> Response:
        body = decode(request.data, RoundProjectionBody)
        asked = round_projection_ask(round_=_round(round_id), values=body.values)
        return Response(RoundReportSerializer(_report_shown(asked)).data, status=202)


def _report_shown(round_: Round) -> dict[str, Any]:
    decided = round_.status == Round.Status.DECIDED
    return {
        "round": round_.pk,
        "status": round_.status,
        "differences": round_.differences,
        "report": round_.report if decided else None,
        "projection": round_.projection if round_.status == Round.Status.OPEN else None,
    }


class RoundCancelView(JsonAPIView):
    rights = {"POST": GATE}
    bodies = {"POST": RoundCancelBody}
    operation_ids = {"POST": "round_cancel"}

    @extend_schema(
        summary="Cancel an open round; the round, as it is now",
        description=(
            "`jobs`: `wait`, its jobs leave the round and stay scheduled, starting at their "
            "start_at as plain scheduled jobs; `cancel`, its jobs are cancelled (nothing of "
            "them goes out). A 409 for a round that is not open."
        ),
        parameters=[ROUND_ID],
        responses={200: RoundSerializer, **errors(400, 404, 409)},
    )
    def post(self, request: Request, round_id: int) -> Response:
        body = decode(request.data, RoundCancelBody)
        cancelled = round_cancel(round_=_round(round_id), jobs=body.jobs, user=request.user)
        return Response(RoundSerializer(round_shown(cancelled, request, jobs=True)).data)
