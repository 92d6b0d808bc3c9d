"""REST views of cap experiments (limits/studies/experiments.py): list, create, read, change, stop
and conclude."""

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import msgspec
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings

from gatekeeper.lib.api import JsonAPIView, errors
from gatekeeper.lib.bodies import decode
from gatekeeper.lib.ids import DATABASE_MAX
from gatekeeper.lib.permissions import (
    ADD_EXPERIMENTS,
    CHANGE_EXPERIMENTS,
    CONCLUDE_EXPERIMENTS,
    VIEW_EXPERIMENTS,
    VIEW_STUDIES,
)
from limits.ledger.api import CsvRenderer, CsvReportView
from limits.models.studies import Experiment
from limits.policy.bodies import ArmRuleBody
from limits.policy.serializers import BodyShapedField
from limits.studies.bodies import ConcludeBody, ExperimentChangeBody, ExperimentCreateBody
from limits.studies.experiments import (
    STATUSES,
    ArmFields,
    ExperimentFields,
    experiment_as_json,
    experiment_change,
    experiment_conclude,
    experiment_create,
    experiment_stop,
)
from limits.studies.report import (
    CSV_COLUMNS,
    EVENT_MAX,
    report_period,
    report_rows,
    study_of,
    study_report,
    today_utc,
)

EXPERIMENT_ID = OpenApiParameter(
    "experiment_id",
    {"type": "integer", "minimum": 1, "maximum": DATABASE_MAX},
    OpenApiParameter.PATH,
    description="The experiment's id.",
)
CHECKS = (
    "Checked whole by the one rule (limits.studies.experiments.experiment_problems): 2 to 5 arms, each "
    "with a share above 0 (together at most 1: the rest of the users are in no arm), its own "
    "name and at least one valid rule; a start (not in the past) before the end, at most a year "
    "apart; no other live experiment on the same users at the same time. A 400 names each "
    "field (`arms.1.rules.0.limit`) and nothing is kept."
)


class ArmSerializer(serializers.Serializer):
    name = serializers.CharField()
    share = serializers.FloatField()
    mode = serializers.ChoiceField(choices=["replace", "add"])
    rules = serializers.ListField(child=BodyShapedField(ArmRuleBody))


class ExperimentSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    segment = serializers.CharField(allow_null=True, help_text="null: every segment.")
    arms = ArmSerializer(many=True)
    starts_at = serializers.DateTimeField()
    ends_at = serializers.DateTimeField()
    status = serializers.ChoiceField(
        choices=STATUSES,
        help_text="scheduled (before its start), running, ended (past its end), stopped (by a "
        "person) or concluded (an arm promoted).",
    )
    stopped_at = serializers.DateTimeField(allow_null=True)
    concluded_arm = serializers.CharField(allow_null=True, help_text="The arm promoted.")
    salt = serializers.CharField(help_text="What the arms are drawn from.")


class ConcludedSerializer(ExperimentSerializer):
    change = serializers.CharField(help_text="What concluding did to the rules, in words.")


def _found(experiment_id: int) -> Experiment:
    row = Experiment.objects.select_related("segment").filter(pk=experiment_id).first()
    if row is None:
        raise NotFound(f"No experiment {experiment_id}.")
    return row


def _arms(given: list[dict[str, Any]]) -> list[ArmFields]:
    return [
        ArmFields(name=a["name"], share=a["share"], rules=list(a["rules"]), mode=a["mode"])
        for a in given
    ]


def _shown(row: Experiment) -> dict[str, Any]:
    return ExperimentSerializer(experiment_as_json(row)).data


class ExperimentListView(JsonAPIView):
    rights = {"GET": VIEW_EXPERIMENTS, "POST": ADD_EXPERIMENTS}
    bodies = {"POST": ExperimentCreateBody}
    operation_ids = {"GET": "experiments_list", "POST": "experiment_create"}

    @extend_schema(
        summary="Every cap experiment, newest first",
        responses={200: ExperimentSerializer(many=True), **errors()},
    )
    def get(self, request: Request) -> Response:
        rows = Experiment.objects.select_related("segment").prefetch_related("arms")
        now = timezone.now()
        return Response(
            ExperimentSerializer([experiment_as_json(r, now=now) for r in rows], many=True).data
        )

    @extend_schema(
        summary="Create a cap experiment", description=CHECKS,
        responses={201: ExperimentSerializer, **errors(400, 413)},
    )  # fmt: skip
    def post(self, request: Request) -> Response:
        body = decode(request.data, ExperimentCreateBody)
        given = msgspec.to_builtins(body)
        now = timezone.now()
        fields = ExperimentFields(
            name=body.name,
            segment=body.segment,
            arms=_arms(given["arms"]),
            starts_at=now if body.starts_at is msgspec.UNSET else body.starts_at,
            ends_at=body.ends_at,
            salt="" if body.salt is msgspec.UNSET else body.salt,
        )
        row = experiment_create(fields, user=request.user, via="api", now=now)
        return Response(_shown(row), status=201)


class ExperimentDetailView(JsonAPIView):
    rights = {"GET": VIEW_EXPERIMENTS, "PATCH": CHANGE_EXPERIMENTS}
    bodies = {"PATCH": ExperimentChangeBody}
    operation_ids = {"GET": "experiment_get", "PATCH": "experiment_change"}

    @extend_schema(
        summary="One cap experiment",
        parameters=[EXPERIMENT_ID],
        responses={200: ExperimentSerializer, **errors(404)},
    )
    def get(self, request: Request, experiment_id: int) -> Response:
        return Response(_shown(_found(experiment_id)))

    @extend_schema(
        summary="Change some of an experiment's fields",
        description=f"{CHECKS} Once it has started only `name` and `ends_at` change (a report "
        "must not mix two experiments): anything else is a 400 naming it.",
        parameters=[EXPERIMENT_ID],
        responses={200: ExperimentSerializer, **errors(400, 404, 413)},
    )
    def patch(self, request: Request, experiment_id: int) -> Response:
        row = _found(experiment_id)
        body = decode(request.data, ExperimentChangeBody)
        changes: dict[str, Any] = {}
        for name in body.__struct_fields__:
            value = getattr(body, name)
            if value is msgspec.UNSET:
                continue
            changes[name] = _arms(msgspec.to_builtins(value)) if name == "arms" else value
        changed = experiment_change(row, changes, user=request.user, via="api")
        return Response(_shown(changed))


class ExperimentStopView(JsonAPIView):
    rights = {"POST": CHANGE_EXPERIMENTS}
    operation_ids = {"POST": "experiment_stop"}

    @extend_schema(
        summary="Stop an experiment now",
        description="Its arms no longer apply: every user is back on the segment's rules. A 409 "
        "naming `status` when it is already stopped or concluded.",
        parameters=[EXPERIMENT_ID],
        request=None,
        responses={200: ExperimentSerializer, **errors(404, 409)},
    )
    def post(self, request: Request, experiment_id: int) -> Response:
        row = experiment_stop(_found(experiment_id), user=request.user, via="api")
        return Response(_shown(row))


class ExperimentConcludeView(JsonAPIView):
    rights = {"POST": CONCLUDE_EXPERIMENTS}
    bodies = {"POST": ConcludeBody}
    operation_ids = {"POST": "experiment_conclude"}

    @extend_schema(
        summary="Conclude an experiment: promote one arm's rules to its segment",
        description="The arm's rules become rules of the segment (of every segment, for an "
        "experiment on every segment); an arm that replaces disables the segment's own rules on "
        "the channels its rules name. Each rule's change is in its history (via experiment). "
        "A 409 naming `status` for a scheduled or concluded experiment; a 400 naming `arm` for "
        "an arm it does not have.",
        parameters=[EXPERIMENT_ID],
        responses={200: ConcludedSerializer, **errors(400, 404, 409, 413)},
    )
    def post(self, request: Request, experiment_id: int) -> Response:
        body = decode(request.data, ConcludeBody)
        row, words = experiment_conclude(
            _found(experiment_id), body.arm, user=request.user, via="api"
        )
        return Response(ConcludedSerializer({**experiment_as_json(row), "change": words}).data)


# --- the experiments report ---------------------------------------------------------------------


class ExperimentReportCsvRenderer(CsvRenderer):
    """The experiments report: a row per arm and measure."""

    def table(self, data: Any) -> tuple[list[str], Iterable[Mapping[str, Any]]]:
        return CSV_COLUMNS, report_rows(data)


class MeasureSerializer(serializers.Serializer):
    mean = serializers.FloatField(help_text="Per user.")
    low = serializers.FloatField(allow_null=True, help_text="95 % interval (null: too few).")
    high = serializers.FloatField(allow_null=True)


class LiftSerializer(serializers.Serializer):
    difference = serializers.FloatField(help_text="This arm's mean less the reference's.")
    low = serializers.FloatField()
    high = serializers.FloatField()
    relative = serializers.FloatField(allow_null=True, help_text="The difference over the "
                                      "reference's mean (0.021: 2.1 % more); null when it is 0.")  # fmt: skip
    relative_low = serializers.FloatField(allow_null=True)
    relative_high = serializers.FloatField(allow_null=True)
    p_value = serializers.FloatField()
    significant = serializers.BooleanField(help_text="The 95 % interval leaves out 0.")


class ReportArmSerializer(serializers.Serializer):
    name = serializers.CharField()
    share = serializers.FloatField()
    users = serializers.IntegerField(help_text="Users who entered up to the period's last day.")
    measures = serializers.DictField(child=MeasureSerializer(), help_text="By measure key.")
    lift = serializers.DictField(
        child=LiftSerializer(allow_null=True),
        allow_null=True,
        help_text="Against the reference, by measure key (null: this is the reference; a "
        "measure's null: too few users).",
    )


class ReportMeasureSerializer(serializers.Serializer):
    key = serializers.CharField(
        help_text="sends, unsubscribes, complaints, and per event name `<name>` (conversions) "
        "and `<name>.value`."
    )
    per_user = serializers.CharField(help_text="What it counts, per user.")


class ExperimentReportSerializer(serializers.Serializer):
    study = serializers.DictField(help_text="The experiment, or the control group.")
    from_ = serializers.DateField()
    to = serializers.DateField()
    reference = serializers.CharField(help_text="The arm the others are compared with.")
    measures = ReportMeasureSerializer(many=True)
    arms = ReportArmSerializer(many=True)
    sample_ratio_p = serializers.FloatField(allow_null=True)
    split_off = serializers.BooleanField(
        help_text="The arms' sizes are not what their shares say (p below 0.001)."
    )
    verdict = serializers.CharField(help_text="The result in plain words.")

    def get_fields(self) -> dict[str, Any]:
        fields = super().get_fields()
        fields["from"] = fields.pop("from_")
        return fields


STUDY = OpenApiParameter(
    "study",
    {"type": "string", "pattern": "^(?:holdout|[0-9]{1,18})$"},
    OpenApiParameter.PATH,
    description="An experiment's id, or `holdout` for the global control group.",
)


class ExperimentReportView(CsvReportView):
    rights = {"GET": VIEW_STUDIES}
    operation_ids = {"GET": "experiment_report"}
    renderer_classes = [
        *cast(Sequence[type[BaseRenderer]], api_settings.DEFAULT_RENDERER_CLASSES),
        ExperimentReportCsvRenderer,
    ]
    csv_renderer = ExperimentReportCsvRenderer

    @extend_schema(
        summary="An experiment's result (or the control group's): per arm, with 95 % intervals "
        "and the lift against the reference",
        description="Users (every user who entered up to `to`: their first marketing decision "
        "while it ran), and per user over the period the marketing sends, each outcome event's "
        "conversions and value, unsubscribes and complaints, each with its 95 % interval; each "
        "arm's lift against the reference (the control group's held-out users, or the first "
        "arm) with its interval, p-value and whether it is significant; a verdict in words. "
        "From the study's daily counts (limits/studies/measures.py), never the ledger. As CSV with "
        "`?format=csv` or `Accept: text/csv`: a row per arm and measure.",
        parameters=[
            STUDY,
            OpenApiParameter(
                "from",
                {"type": "string", "format": "date"},
                description="The first UTC day; default: the experiment's first (the control "
                "group: 30 days before `to`).",
            ),
            OpenApiParameter(
                "to",
                {"type": "string", "format": "date"},
                description="The last UTC day, included; default: today, or the experiment's last.",
            ),
            OpenApiParameter(
                "event",
                {"type": "string", "maxLength": EVENT_MAX},
                description="The event the verdict reads; default: the most frequent.",
            ),
            OpenApiParameter("format", {"type": "string", "enum": ["json", "csv"]}),
        ],
        responses={
            (200, "application/json"): OpenApiResponse(ExperimentReportSerializer),
            (200, "text/csv"): OpenApiResponse(OpenApiTypes.STR, description="Rows as CSV."),
            **{(code, "application/json"): error for code, error in errors(400, 404).items()},
        },
    )
    def get(self, request: Request, study: str) -> Response:
        today = today_utc()
        found = study_of(study, today=today)
        if found is None:
            raise NotFound(f"No experiment {study[:40]}.")
        start, end, event = report_period(found, dict(request.query_params.lists()), today=today)
        report = study_report(found, start=start, end=end, event=event)
        response = Response(ExperimentReportSerializer(report).data)
        if self.as_csv(request):
            response.data = report
            name = f"experiment-{study}-{start}-{end}.csv"
            response["Content-Disposition"] = f'attachment; filename="{name}"'
        return response
