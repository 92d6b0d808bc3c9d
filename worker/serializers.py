"""Shapes of the gate's and send jobs' REST answers, for the OpenAPI schema. Request bodies are
msgspec structs (worker/bodies.py); the schema of each is generated from it."""

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from limits.policy.bodies import Window
from limits.policy.serializers import BodyShapedField, ExperimentArmSerializer
from limits.reasons import CATEGORIES, REASONS
from worker.delivery.dead_addresses import dead_addresses_shown
from worker.models import Round, SendJob
from worker.selectors import send_job_waiting


class WindowCountsSerializer(serializers.Serializer):
    """Sends in the window (empty for exempt and unavailable decisions)."""

    daily = serializers.IntegerField(required=False)
    weekly = serializers.IntegerField(required=False)


class WindowLimitsSerializer(serializers.Serializer):
    """The caps of the log the counts describe (empty for exempt decisions)."""

    daily = serializers.IntegerField(required=False, allow_null=True, help_text="null: no cap")
    weekly = serializers.IntegerField(required=False, allow_null=True, help_text="null: no cap")


class DecidingRuleSerializer(serializers.Serializer):
    """The rule that refused a send (its id in GET /api/v1/rules/)."""

    id = serializers.IntegerField(
        help_text="0 for a person's own frequency; below 0 for a rule of an experiment's arm."
    )
    kind = serializers.ChoiceField(
        choices=["rule", "person", "arm"],
        help_text="rule: a marketer's rule; person: the person's own frequency (their "
        "preferences), refused as `cap`; arm: a rule of the user's arm of a running "
        "experiment.",
    )
    name = serializers.CharField()
    window = BodyShapedField(Window)
    limit = serializers.IntegerField(help_text="The rule's own limit (before any reserve).")
    used = serializers.IntegerField(help_text="The matching sends it counts in its window.")


class PreferenceOffSerializer(serializers.Serializer):
    """What the person switched off: a topic on a channel, or (topic null) the channel."""

    topic = serializers.CharField(allow_null=True, help_text="null: the whole channel.")
    channel = serializers.CharField()


class DecisionSerializer(serializers.Serializer):
    user_id = serializers.IntegerField()
    message_id = serializers.CharField()
    segment = serializers.CharField(allow_null=True)
    allowed = serializers.BooleanField()
    reason = serializers.ChoiceField(
        choices=REASONS,
        help_text="daily_cap / weekly_cap: the deciding rule's window is a day / a week "
        "(rolling or calendar); cap: any other window; blocked: a limit of 0.",
    )
    counts = WindowCountsSerializer()
    limits = WindowLimitsSerializer()
    rule = DecidingRuleSerializer(
        allow_null=True,
        help_text="On a refusal by a rule: the rule that decided it (when several refuse, the "
        "one whose room comes last). null otherwise.",
    )
    reserved = serializers.IntegerField(
        allow_null=True,
        help_text="When the rule had room but its reserve kept the last slots for sends of a "
        "higher priority: how many. null otherwise.",
    )
    reserved_for = serializers.IntegerField(
        allow_null=True,
        help_text="On reason `reserved`: the scheduled job (GET /api/v1/sends/<id>/) whose "
        "reservation holds the slot until it starts. null otherwise.",
    )
    preference = PreferenceOffSerializer(
        allow_null=True,
        help_text="On reason preference: what the person switched off. null otherwise.",
    )
    experiment = ExperimentArmSerializer(
        allow_null=True,
        help_text="When the user is in a running experiment (whatever the reason): which, and "
        "their arm. null otherwise.",
    )
    retry_after = serializers.FloatField(
        allow_null=True,
        help_text="Seconds until a slot frees; for quiet_hours, until they end plus the "
        "user's own place in the spread; for paused, until the pause ends.",
    )


class GateResultsSerializer(serializers.Serializer):
    results = DecisionSerializer(many=True)


class ReleaseResultSerializer(serializers.Serializer):
    user_id = serializers.IntegerField()
    message_id = serializers.CharField()
    released = serializers.BooleanField()


class ReleaseResultsSerializer(serializers.Serializer):
    results = ReleaseResultSerializer(many=True)


class InvalidRowSerializer(serializers.Serializer):
    row = serializers.IntegerField(
        help_text="Its position in `recipients` (or the file's), from 0."
    )
    line = serializers.IntegerField(
        required=False, help_text="From a file: its line, from 1 (a header line counts)."
    )
    field = serializers.CharField()
    message = serializers.CharField()


class WaitingSerializer(serializers.Serializer):
    """The job's sends deferred by the gate (caps, quiet hours) that wait for their release."""

    sends = serializers.IntegerField(help_text="How many wait (part of `pending`).")
    next_at = serializers.DateTimeField(
        allow_null=True,
        help_text="When the first of them is released (null: none waits). Sends are released "
        "in groups by minute, each at the latest release in it: never before a send's own.",
    )
    last_at = serializers.DateTimeField(
        allow_null=True, help_text="When the last of them is released (null: none waits)."
    )


class DeadAddressSerializer(serializers.Serializer):
    user_id = serializers.IntegerField(min_value=0)
    address = serializers.CharField()
    reason = serializers.CharField(help_text="What the provider said.")
    at = serializers.DateTimeField()


class DeadAddressesSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    first = DeadAddressSerializer(many=True, help_text="The first 100, in the order met.")

    def to_representation(self, instance: Any) -> Any:
        return super().to_representation(dead_addresses_shown(instance))


class SendJobSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    channel = serializers.CharField()
    campaign = serializers.CharField()
    template = serializers.CharField()
    category = serializers.ChoiceField(choices=CATEGORIES)
    tags = serializers.ListField(child=serializers.CharField())
    priority = serializers.IntegerField()
    topic = serializers.CharField(
        allow_blank=True, help_text="What the sends are about (a topic's slug); empty: none."
    )
    on_capped = serializers.ChoiceField(choices=SendJob.OnCapped.choices)
    on_invalid = serializers.ChoiceField(choices=SendJob.OnInvalid.choices)
    status = serializers.ChoiceField(choices=SendJob.Status.choices)
    total = serializers.IntegerField(
        help_text="Recipients handed over, invalid rows included (0 while a file is read)."
    )
    processed = serializers.IntegerField(help_text="Recipients with a final outcome.")
    progress = serializers.IntegerField(
        help_text="Percent: while `preparing`, of the file read; then of recipients with a final "
        "outcome."
    )
    source = serializers.CharField(  # type: ignore[assignment]
        help_text="A file's name as uploaded, or store:<key>; empty for recipients listed in JSON."
    )
    source_bytes = serializers.IntegerField(help_text="The file's size as handed over.")
    read_bytes = serializers.IntegerField(help_text="Of it, read so far.")
    error = serializers.CharField(
        help_text="Why a `failed` job's file was refused (the lines named), and what of it had "
        "been sent: nothing after the first bad line."
    )
    paused_at = serializers.DateTimeField(allow_null=True, help_text="null: not paused.")
    cancelled_at = serializers.DateTimeField(allow_null=True, help_text="null: not cancelled.")
    sent = serializers.IntegerField()
    failed = serializers.IntegerField(help_text="Did not go out and will not; quota given back.")
    capped = serializers.IntegerField(help_text="Refused by the gate and not deferred.")
    ambiguous = serializers.IntegerField(
        help_text="May or may not have gone out (a worker died during the send); not repeated."
    )
    duplicate = serializers.IntegerField(
        help_text="Already sent under its message id by another job, or the same user listed "
        "twice with the same message id (one send)."
    )
    invalid = serializers.IntegerField(help_text="Rows refused at creation (on_invalid: skip).")
    expired = serializers.IntegerField(
        help_text="Deferred sends still waiting at `expires_at`, or released only after it."
    )
    cancelled = serializers.IntegerField(
        help_text="Deferred sends waiting when the job's waiting sends were cancelled (DELETE "
        "/api/v1/sends/<id>/waiting/), or deferred after that."
    )
    pending = serializers.IntegerField(
        help_text="Not settled yet (queued, retrying or waiting); sent + failed + capped + "
        "ambiguous + duplicate + invalid + expired + cancelled + pending = total."
    )
    waiting = serializers.SerializerMethodField()
    start_at = serializers.DateTimeField(
        allow_null=True,
        help_text="When it starts; until then it is `scheduled` (null: at once when handed over).",
    )
    started_at = serializers.DateTimeField(
        allow_null=True, help_text="When its chunks were first handed out (null: not yet)."
    )
    reserve = serializers.BooleanField(
        help_text="Until it starts, its predicted sends hold their slots (reason `reserved`)."
    )
    # Not required: a web of the release before rounds, beside this one during a rolling
    # upgrade, answers without them.
    round = serializers.IntegerField(
        source="round_id",
        allow_null=True,
        required=False,
        help_text="The round it competes in (GET /api/v1/rounds/<id>/); null: none.",
    )
    value = serializers.FloatField(
        allow_null=True,
        required=False,
        help_text="In a round, what one of its sends is worth; null: each recipient's own.",
    )
    expires_at = serializers.DateTimeField(
        help_text="Deferred sends still waiting then are dropped (counted as `expired`)."
    )
    waiting_cancelled_at = serializers.DateTimeField(
        allow_null=True,
        help_text="When its waiting sends were cancelled (every later deferral is cancelled "
        "too); null: never.",
    )
    invalid_rows = InvalidRowSerializer(many=True, help_text="The first 100 invalid rows.")
    dead_addresses = DeadAddressesSerializer(
        source="*",
        help_text="Push tokens and mailboxes the provider said are dead (those sends failed); "
        "every one is also POSTed to GATEKEEPER_DEAD_ADDRESS_WEBHOOK when it is set.",
    )
    reasons = serializers.DictField(child=serializers.IntegerField())
    segments = serializers.DictField(child=serializers.IntegerField())
    created_at = serializers.DateTimeField()

    @extend_schema_field(WaitingSerializer)
    def get_waiting(self, job: SendJob) -> dict[str, Any]:
        return WaitingSerializer(send_job_waiting(job.pk)).data


class SendJobCreatedSerializer(SendJobSerializer):
    url = serializers.URLField(help_text="Where to follow the job (also the Location header).")


class PlanRuleSerializer(serializers.Serializer):
    id = serializers.IntegerField(help_text="The rule (GET /api/v1/rules/<id>/).")
    name = serializers.CharField()
    refused = serializers.IntegerField(help_text="Of this job's sends, those it will refuse.")


class PlanTakerSerializer(serializers.Serializer):
    job = serializers.IntegerField(help_text="An earlier scheduled job, or a later reserved one.")
    campaign = serializers.CharField()
    sends = serializers.IntegerField(
        help_text="This job's sends refused by a rule that counts that job's send to the user "
        "(an earlier job), or keeps the slot for it (a later reserved job: reason reserved)."
    )


class JobPlanSerializer(serializers.Serializer):
    job = serializers.IntegerField()
    campaign = serializers.CharField()
    channel = serializers.CharField()
    priority = serializers.IntegerField()
    reserve = serializers.BooleanField(help_text="Its predicted sends hold their slots.")
    start_at = serializers.DateTimeField()
    recipients = serializers.IntegerField()
    sent = serializers.IntegerField(help_text="Predicted to go out (allowed or exempt).")
    held = serializers.IntegerField(help_text="Held by quiet hours at the start.")
    held_from = serializers.DateTimeField(
        allow_null=True, help_text="When the first held send is released (null: none held)."
    )
    held_until = serializers.DateTimeField(
        allow_null=True, help_text="When the last held send is released."
    )
    one_slot_left = serializers.IntegerField(
        allow_null=True,
        help_text="Sends predicted that one more send to the same person before the start "
        "would refuse (their fullest rule had one slot left); null: not known.",
    )
    refused = serializers.DictField(
        child=serializers.IntegerField(),
        help_text="Predicted refusals by reason (daily_cap, cap, blocked, suppressed, "
        "preference, holdout, duplicate...).",
    )
    rules = PlanRuleSerializer(many=True, help_text="The rules that refuse, most first.")
    taken_by = PlanTakerSerializer(
        many=True, help_text="The earlier jobs that take the slots this job needed, most first."
    )
    lost_users = serializers.ListField(
        child=serializers.IntegerField(),
        help_text="The first 100 users who lose a send to an earlier job.",
    )


class PlanSerializer(serializers.Serializer):
    computed_at = serializers.DateTimeField(
        allow_null=True, help_text="When this plan was made (null: none yet)."
    )
    seconds = serializers.FloatField(allow_null=True, help_text="How long it took to make.")
    stale = serializers.BooleanField(
        help_text="A job, a rule or the snapshot changed since (or it is old): a new one is "
        "being made; ask again in a while."
    )
    computing = serializers.BooleanField(help_text="A new plan is being made now.")
    remade_users = serializers.IntegerField(
        allow_null=True,
        help_text="Made again after an edit of some jobs for this many users (theirs) alone, "
        "the others' predictions kept; null: made whole.",
    )
    whole_at = serializers.DateTimeField(
        allow_null=True, help_text="When the plan was last made whole (null: none yet)."
    )
    jobs = JobPlanSerializer(many=True, help_text="The scheduled jobs, in the order they start.")


class BacktestProgressSerializer(serializers.Serializer):
    decisions = serializers.IntegerField(help_text="Decisions replayed so far.")
    expected = serializers.IntegerField(help_text="The ledger's decisions in the period.")
    fraction = serializers.FloatField(help_text="From 0 to 1.")


class BacktestRuleSerializer(serializers.Serializer):
    rule = serializers.IntegerField(allow_null=True, help_text="null: a rule of the draft only.")
    name = serializers.CharField()
    in_draft_only = serializers.BooleanField()
    gained = serializers.IntegerField(
        help_text="Sends this rule refused under the policy in force that the draft admits."
    )
    lost = serializers.IntegerField(
        help_text="Sends admitted now that this rule refuses in the draft."
    )


class BacktestRowSerializer(serializers.Serializer):
    day = serializers.DateField()
    segment = serializers.CharField()
    channel = serializers.CharField()
    campaign = serializers.CharField()
    in_force = serializers.DictField(child=serializers.IntegerField(), help_text="By reason.")
    draft = serializers.DictField(child=serializers.IntegerField(), help_text="By reason.")
    gained = serializers.IntegerField(help_text="Sends the draft admits that were refused.")
    lost = serializers.IntegerField(help_text="Sends the draft refuses that were admitted.")
    users_affected = serializers.IntegerField(help_text="Users with a decision that differs.")
    rules = BacktestRuleSerializer(many=True, help_text="The rules that made the difference.")


class BacktestReproducedSerializer(serializers.Serializer):
    decisions = serializers.IntegerField()
    differences = serializers.IntegerField(
        help_text="Decisions of the policy in force replayed that differ from the ledger's."
    )
    examples = serializers.ListField(child=serializers.DictField(), help_text="The first few.")


class BacktestResultSerializer(serializers.Serializer):
    decisions = serializers.IntegerField()
    reproduced = BacktestReproducedSerializer()
    totals = serializers.DictField(help_text="gained, lost, users_affected, in_force, draft.")
    rules = BacktestRuleSerializer(many=True)
    rows = BacktestRowSerializer(many=True, help_text="Per day x segment x channel x campaign.")


class BacktestSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    url = serializers.CharField()
    changes = serializers.DictField(help_text="The draft, as given.")
    status = serializers.ChoiceField(choices=["queued", "running", "done", "failed"])
    parts = serializers.IntegerField(help_text="Replayed in this many parts, by user id.")
    progress = BacktestProgressSerializer()
    error = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)
    result = BacktestResultSerializer(allow_null=True, help_text="Once done.")

    def get_fields(self) -> dict[str, Any]:
        fields = super().get_fields()
        period = {
            "from": serializers.DateField(help_text="The period's first UTC day."),
            "to": serializers.DateField(help_text="Its last, included."),
        }
        # `partial` is a serializer's own attribute: the field is named here.
        fields["partial"] = serializers.CharField(
            allow_null=True, help_text="What the ledger does not hold of what the replay needs."
        )
        return {"id": fields.pop("id"), "url": fields.pop("url"), **period, **fields}


class RoundJobSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    campaign = serializers.CharField()
    channel = serializers.CharField()
    status = serializers.ChoiceField(choices=SendJob.Status.choices)
    priority = serializers.IntegerField(help_text="Ties of value go to the higher priority.")
    value = serializers.FloatField(
        allow_null=True,
        help_text="What one of its sends is worth; null: each recipient's own (its file's "
        "`value` column, its rows' `value`).",
    )
    total = serializers.IntegerField(help_text="Its recipients.")
    created_at = serializers.DateTimeField(help_text="Ties of value and priority: made first.")


class RoundSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    url = serializers.CharField()
    name = serializers.CharField()
    channel = serializers.CharField(help_text='A channel, or "all": jobs on any channel.')
    closes_at = serializers.DateTimeField(
        help_text="Jobs join, leave or change their value until then."
    )
    send_at = serializers.DateTimeField(help_text="When its jobs start (at or after closes_at).")
    status = serializers.ChoiceField(
        choices=Round.Status.choices,
        help_text="open: jobs join, leave or change their value until closes_at; deciding; "
        "decided: its jobs start at send_at; cancelled.",
    )
    job_count = serializers.IntegerField(help_text="The jobs in it.")
    created_at = serializers.DateTimeField()
    decided_at = serializers.DateTimeField(allow_null=True, help_text="null: not decided.")
    cancelled_at = serializers.DateTimeField(allow_null=True, help_text="null: not cancelled.")
    # One round's answer only (GET, PATCH, cancel), not the list's: one shape, so that its
    # status's choices are one enum of the schema.
    jobs = RoundJobSerializer(
        many=True, required=False, help_text="Its jobs, in the order they joined (one round's)."
    )
    report = serializers.DictField(
        allow_null=True,
        required=False,
        help_text="Once decided: what the decision chose, per job (null until then; one "
        "round's). Its shape: GET /api/v1/rounds/<id>/report/.",
    )


class RoundOutrankedBySerializer(serializers.Serializer):
    job = serializers.IntegerField(help_text="The job whose sends won the slot.")
    count = serializers.IntegerField(help_text="This job's sends it outranked.")


class RoundFirstComeSerializer(serializers.Serializer):
    won = serializers.IntegerField(help_text="Sends first come, first served admits.")
    value = serializers.FloatField(help_text="What they are worth.")


class RoundReportJobSerializer(serializers.Serializer):
    job = serializers.IntegerField()
    campaign = serializers.CharField()
    channel = serializers.CharField()
    priority = serializers.IntegerField()
    value = serializers.FloatField(allow_null=True, help_text="The job's value (null: per row).")
    candidates = serializers.IntegerField(help_text="Its recipients, each user once.")
    fit_alone = serializers.IntegerField(
        help_text="Of them, those the gate would admit were nothing else sent; the rest get the "
        "gate's own reason when the job runs."
    )
    won = serializers.IntegerField(help_text="Sends chosen: they go through the gate.")
    outranked = serializers.IntegerField(help_text="Sends refused as outranked.")
    outranked_by = RoundOutrankedBySerializer(many=True)
    value_won = serializers.FloatField(help_text="What the sends chosen are worth.")
    first_come = RoundFirstComeSerializer(
        help_text="What first come, first served would have won on the same candidates, the "
        "jobs one after the other in the order they start."
    )


class RoundReportBodySerializer(serializers.Serializer):
    send_at = serializers.DateTimeField()
    users = serializers.IntegerField(help_text="Users with a send that fits alone.")
    contested = serializers.IntegerField(help_text="Of them, those with two or more.")
    value_won = serializers.FloatField()
    first_come_value = serializers.FloatField()
    gain = serializers.FloatField(help_text="value_won - first_come_value: deciding by value.")
    jobs = RoundReportJobSerializer(many=True)
    decided_at = serializers.DateTimeField(required=False, help_text="A decision's only.")
    seconds = serializers.FloatField(required=False, help_text="How long the decision took.")
    steps = serializers.ListField(
        child=serializers.ListField(), required=False, help_text="[step, seconds], in order."
    )


class RoundProjectionSerializer(serializers.Serializer):
    at = serializers.DateTimeField(help_text="When it was computed.")
    values = serializers.DictField(
        child=serializers.FloatField(), help_text="Job id -> the value tried instead of its own."
    )
    report = RoundReportBodySerializer()


class RoundReportSerializer(serializers.Serializer):
    round = serializers.IntegerField()
    status = serializers.ChoiceField(choices=Round.Status.choices)
    differences = serializers.IntegerField(
        help_text="Chosen sends the gate refused when their job ran (0 when nothing else was "
        "sent in between)."
    )
    report = RoundReportBodySerializer(allow_null=True, help_text="Once decided.")
    projection = RoundProjectionSerializer(
        allow_null=True,
        help_text="Before it closes: what it would choose, as last asked (POST to this URL).",
    )


class RoundListSerializer(serializers.Serializer):
    results = RoundSerializer(many=True, help_text="Newest close first.")
