"""Request bodies of the gate, of send jobs and of rounds, as msgspec structs
(gatekeeper.lib.bodies).

The structs hold the shape (types, lengths, enumerations); what depends on settings or on the
loaded snapshot (known channels, the widest user id, a template that exists) is checked after
decoding, by the view or the service, with the same 400 format.
"""

from datetime import date, datetime
from typing import Annotated, Any, Literal

from msgspec import UNSET, Meta, UnsetType, field

from gatekeeper.lib.bodies import Body, schema_fill
from gatekeeper.lib.ids import DATABASE_MAX, JsonUserId
from limits.engine.table import DEFAULT_PRIORITY
from limits.policy.bodies import Channel, DraftBody, Priority, Scope, SendTopic, Tags
from limits.policy.rules import CAMPAIGN_MAX
from limits.reasons import Category
from segments.bodies import TimeZone
from segments.store import KEY_MAX
from worker.delivery.rendering import TEMPLATE_NAME, template_names
from worker.models import EXPIRY_DEFAULT, EXPIRY_MAX, JOB_CAMPAIGN_MAX, MESSAGE_ID_MAX, START_MAX

GATE_LIMIT = 10_000
SEND_LIMIT = 100_000
# Body limits that fit the batch limits: 10,000 requests with message ids of up to 200
# characters, even written as \\u escapes; 100,000 recipients of about 640 bytes each.
GATE_BODY_BYTES = 16 * 2**20
SEND_BODY_BYTES = 64 * 2**20

MessageId = Annotated[str, Meta(min_length=1, max_length=MESSAGE_ID_MAX)]


UserTimeZone = Annotated[
    TimeZone | None,
    Meta(
        description="The user's IANA time zone (Europe/Paris), for calendar windows; null: "
        "their segment's, else GATEKEEPER_DEFAULT_TIME_ZONE."
    ),
]


class GateRequest(Body, kw_only=True):
    user_id: JsonUserId
    message_id: MessageId
    time_zone: UserTimeZone = None


class GateCheckBody(Body, kw_only=True):
    channel: Channel
    campaign: Annotated[str, Meta(max_length=CAMPAIGN_MAX)] = ""
    topic: SendTopic = None
    category: Category = Category.MARKETING
    tags: Tags = []
    priority: Priority = DEFAULT_PRIORITY
    dry_run: bool = False
    requests: Annotated[list[GateRequest], Meta(min_length=1, max_length=GATE_LIMIT)]


class GateReleaseBody(Body, kw_only=True):
    channel: Channel
    # The requests as checked (a time zone is not needed to take a send back, but may be there).
    requests: Annotated[list[GateRequest], Meta(min_length=1, max_length=GATE_LIMIT)]


# What a send is worth in a round: a number >= 0 (worker.recipients.value_problem says it).
VALUE_WORDS = (
    "What one send of the job is worth in its round: a number of at least 0; when the round "
    "closes, each user gets the sends of the highest total value that fit every rule."
)
JobValue = Annotated[float, Meta(ge=0, description=VALUE_WORDS)]
RoundId = Annotated[
    int,
    Meta(
        ge=1,
        le=DATABASE_MAX,
        description="An open round (GET /api/v1/rounds/) the job competes in until it closes: "
        "the job waits as `scheduled` and starts at the round's send_at (start_at left out, or "
        "that instant); its channel the round's (any for a round on `all`), a marketing job, "
        "not reserved. Needs a value: the job's `value`, or every recipient's own.",
    ),
]
# Checked with the row's other fields, as a time zone is: a value that is not a number >= 0 is
# this row's error, refusing the job or skipping the row as on_invalid says (so the schema
# says a number, and the struct takes a string too, to name it).
RecipientValue = Annotated[
    float | str,
    Meta(
        description="In a round: what this recipient's send is worth (a number >= 0), instead "
        "of the job's value. Anything else is an invalid row.",
        extra_json_schema=schema_fill("value", lambda: {"type": "number", "minimum": 0}),
    ),
]


class RecipientBody(Body, kw_only=True):
    user_id: JsonUserId
    address: Annotated[
        str, Meta(min_length=1, max_length=4096, description="An email address or a push token.")
    ]
    message_id: (
        Annotated[
            str, Meta(min_length=1, max_length=200, description="Default: <campaign>:<user_id>.")
        ]
        | None
    ) = None
    context: Annotated[dict[str, Any], Meta(description="Template variables.")] = {}
    # Checked with the row's other fields: an unknown zone is this row's error, refusing the
    # job or skipping the row as on_invalid says (so the schema cannot list the names).
    time_zone: (
        Annotated[
            str,
            Meta(
                description="The user's IANA time zone (Europe/Paris), for calendar windows; "
                "null: their segment's, else GATEKEEPER_DEFAULT_TIME_ZONE. An unknown one is "
                "an invalid row."
            ),
        ]
        | None
    ) = None
    value: RecipientValue | None = None


JobTemplate = Annotated[
    str,
    Meta(
        pattern=TEMPLATE_NAME,
        description="Templates under templates/<channel>/<template>/.",
        extra_json_schema=schema_fill(
            "template", lambda: {"type": "string", "enum": template_names()}
        ),
    ),
]
OnCapped = Annotated[
    Literal["drop", "defer"],
    Meta(
        description="drop: sends refused by a cap or quiet hours are counted as `capped`; "
        "defer: they wait (in the database) until their `retry_after` and are gated again "
        "then, grouped by the minute of their release (never before it)."
    ),
]
StartAt = Annotated[
    datetime,
    Meta(
        description="ISO 8601 with its UTC offset, in the future, at most "
        f"{START_MAX.days} days ahead: the job waits as `scheduled` until then (it can be "
        "edited, rescheduled, started early or cancelled meanwhile), and starts within seconds "
        "of it. null or absent: it starts at once."
    ),
]
Reserve = Annotated[
    bool,
    Meta(
        description="A scheduled job only: until it starts, its predicted sends (the plan, GET "
        "/api/v1/plan/) hold their slots: an earlier send of a lower priority that would take "
        "one is refused with reason `reserved` naming this job."
    ),
]
ExpiresAt = Annotated[
    datetime,
    Meta(
        description="ISO 8601 with its UTC offset (2026-06-11T09:00:00+02:00 or ...Z), after "
        f"the job's start, at most {EXPIRY_MAX.days} days after it; default "
        f"{int(EXPIRY_DEFAULT.total_seconds() // 3600)} hours after its start (its start_at, "
        "or its creation). Deferred sends still waiting then (or released only after it) count "
        "as `expired`."
    ),
]


class SendJobBody(Body, kw_only=True):
    channel: Channel
    campaign: Annotated[
        str,
        Meta(
            min_length=1,
            max_length=JOB_CAMPAIGN_MAX,
            description="Also the start of the default message ids, <campaign>:<user_id>.",
        ),
    ]
    template: JobTemplate
    topic: SendTopic = None
    category: Category = Category.MARKETING
    tags: Tags = []
    priority: Priority = DEFAULT_PRIORITY
    on_capped: OnCapped = "drop"
    start_at: StartAt | None = None
    reserve: Reserve = False
    expires_at: ExpiresAt | None = None
    round: RoundId | None = None
    value: JobValue | None = None
    on_invalid: Annotated[
        Literal["reject", "skip"],
        Meta(
            description="reject: a bad recipient row refuses the job (400 naming it); skip: bad "
            "rows are counted as `invalid`, with their reasons, and the rest is sent."
        ),
    ] = "reject"
    recipients: (
        Annotated[
            list[RecipientBody],
            Meta(
                min_length=1,
                max_length=SEND_LIMIT,
                description="The recipients, or (for more) a file: `recipients_key`, or a "
                "multipart/form-data upload.",
            ),
        ]
        | None
    ) = None
    recipients_key: (
        Annotated[
            str,
            Meta(
                min_length=1,
                max_length=KEY_MAX,
                description="Instead of `recipients`: the key of a campaign file (CSV, plain or "
                "gzip; docs/worker.md) in the configured store, relative to its root "
                "(GATEKEEPER_STORE_URL), such as campaigns/2026-11-25/blast.csv.gz.",
            ),
        ]
        | None
    ) = None


class SendJobChangeBody(Body, kw_only=True):
    """A job that has not started, edited: only the fields given change. A new start_at moves
    its expiry by as much, unless expires_at is given too. `round`: join an open round (the start
    moves to its send_at), or null to leave it (the job stays scheduled at its start); `value`:
    the job's value in its round (null: each recipient's own)."""

    start_at: StartAt | UnsetType = UNSET
    reserve: Reserve | UnsetType = UNSET
    expires_at: ExpiresAt | UnsetType = UNSET
    template: JobTemplate | UnsetType = UNSET
    topic: SendTopic | UnsetType = UNSET
    tags: Tags | UnsetType = UNSET
    priority: Priority | UnsetType = UNSET
    on_capped: OnCapped | UnsetType = UNSET
    round: RoundId | UnsetType | None = UNSET
    value: JobValue | UnsetType | None = UNSET


# A multipart/form-data upload: the job's fields as form fields (tags comma separated or
# repeated), the file as the part `recipients_file`.
FILE_PART = "recipients_file"
FORM_LISTS = ("tags",)
FORM_INTEGERS = ("priority", "round")
FORM_NUMBERS = ("value",)
FORM_BOOLEANS = ("reserve",)


def form_fields(form: Any, files: Any) -> dict[str, Any]:
    """A multipart form's fields (a QueryDict, without its `files`) as the JSON object
    SendJobBody reads: lists split on commas, integers as numbers when they are digits, numbers
    when they read as finite decimals (else left for the 400 to name)."""
    fields: dict[str, Any] = {}
    for name in form:
        if name in files:
            continue
        values = form.getlist(name)
        if name in FORM_LISTS:
            fields[name] = [v.strip() for value in values for v in value.split(",") if v.strip()]
        elif name in FORM_INTEGERS and len(values) == 1 and values[0].strip().isdigit():
            fields[name] = int(values[0])
        elif name in FORM_NUMBERS and len(values) == 1 and _decimal(values[0]) is not None:
            fields[name] = _decimal(values[0])
        elif name in FORM_BOOLEANS and len(values) == 1 and values[0] in ("true", "false"):
            fields[name] = values[0] == "true"
        else:
            fields[name] = values[0] if len(values) == 1 else values
    return fields


def _decimal(text: str) -> float | None:
    """A form's number (`2.5`, `3`), or None when it is not a finite decimal."""
    cell = text.strip()
    digits = cell.removeprefix("-").replace(".", "", 1)  # below 0: the 400 says so
    if not digits.isascii() or not digits.isdigit():
        return None
    return float(cell)


RoundName = Annotated[
    str, Meta(min_length=1, max_length=200, description="What it is, for people.")
]
ClosesAt = Annotated[
    datetime,
    Meta(
        description="ISO 8601 with its UTC offset, in the future, at most "
        f"{START_MAX.days} days ahead: jobs join, leave or change their value until then; "
        "then the round is decided."
    ),
]
SendAt = Annotated[
    datetime,
    Meta(
        description="ISO 8601 with its UTC offset, at or after closes_at (default: closes_at): "
        "when the round's jobs start. Moving it moves every joined job's start_at."
    ),
]


class RoundBody(Body, kw_only=True):
    """POST /api/v1/rounds/: a round that jobs join until it closes."""

    name: RoundName
    channel: Annotated[
        Scope,
        Meta(description='The channel its jobs send on, or "all": jobs on any channel.'),
    ]
    closes_at: ClosesAt
    send_at: SendAt | None = None


class RoundChangeBody(Body, kw_only=True):
    """PATCH /api/v1/rounds/<id>/: an open round's name and times (its channel cannot change:
    its jobs were checked against it)."""

    name: RoundName | UnsetType = UNSET
    closes_at: ClosesAt | UnsetType = UNSET
    send_at: SendAt | UnsetType = UNSET


class RoundCancelBody(Body, kw_only=True):
    """POST /api/v1/rounds/<id>/cancel/."""

    jobs: Annotated[
        Literal["wait", "cancel"],
        Meta(
            description="wait: its jobs leave the round and stay scheduled, starting at their "
            "start_at as plain scheduled jobs; cancel: its jobs are cancelled (nothing of them "
            "goes out)."
        ),
    ]


class RoundProjectionBody(Body, kw_only=True):
    """POST /api/v1/rounds/<id>/report/: what the open round would choose now."""

    values: Annotated[
        dict[int, float],
        Meta(
            description="Job id -> a value (a number >= 0) tried instead of the job's own: what "
            "changing it would do. Empty: the round as it is."
        ),
    ] = {}


class BacktestBody(Body, kw_only=True):
    """POST /api/v1/backtests/: a draft of the policy and the ledger's days to replay it on."""

    start: Annotated[
        date, Meta(description="The period's first UTC day (YYYY-MM-DD), within the ledger's.")
    ] = field(name="from")
    end: Annotated[date, Meta(description="Its last UTC day, included.")] = field(name="to")
    changes: Annotated[
        DraftBody,
        Meta(
            description="Rules, quiet hours and classic caps added, changed or deleted, each "
            "checked as saving it would check it; empty: the policy in force replayed alone."
        ),
    ] = field(default_factory=DraftBody)
