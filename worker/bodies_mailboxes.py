"""Request bodies of the mailbox providers and the warm-up plans (worker/api_mailboxes.py). Each
is checked whole after decoding by its kind's one rule (worker.delivery.mailboxes.
mailbox_problems, worker.delivery.warmup.warmup_problems): what a schema cannot say (a domain
in one group only, groups that exist, a time zone this machine knows) is said there."""

from datetime import date
from typing import Annotated

from msgspec import UNSET, Meta, UnsetType

from gatekeeper.lib.bodies import Body, words_for_pattern
from segments.bodies import TimeZone
from worker.delivery.mailboxes import (
    DOMAINS_MAX,
    GROUPS_MAX,
    SLUG,
)
from worker.delivery.throttle import PROVIDER, RATE_MAX
from worker.delivery.warmup import DAYS_MAX, VOLUME_MAX

GroupSlug = Annotated[
    str,
    Meta(
        pattern=words_for_pattern(
            f"^{SLUG.pattern}$",
            "Lowercase letters, digits, '-' and '_', starting with a letter, at most 32.",
        ),
        description="The group's name in rates, warm-up plans and holds: never changes.",
    ),
]
GroupName = Annotated[str, Meta(min_length=1, max_length=100, description="For people.")]
Domains = Annotated[
    list[
        Annotated[
            str,
            Meta(
                min_length=1,
                max_length=253,
                description="A domain: lowercase labels of letters, digits and '-', the last "
                "one may be * (hotmail.*); checked by worker.delivery.dns_checks.hostname_problem.",
            ),
        ]
    ],
    Meta(
        max_length=DOMAINS_MAX,
        description="Recipient domains, each in one group only: `gmail.com`, or `hotmail.*` "
        "for every last label (hotmail.com, hotmail.co.uk).",
    ),
]
MxHosts = Annotated[
    list[
        Annotated[
            str,
            Meta(
                min_length=1,
                max_length=253,
                description="An MX host suffix: lowercase labels of letters, digits and '-'.",
            ),
        ]
    ],
    Meta(
        max_length=DOMAINS_MAX,
        description="MX host suffixes (`google.com`): a domain no group names is matched by "
        "its mail servers when GATEKEEPER_MAILBOX_MX_LOOKUP is on.",
    ),
]
Messages = Annotated[
    float,
    Meta(
        gt=0,
        le=RATE_MAX * 3600,
        description="Messages in that period (null: no limit in it).",
    ),
]


class RateBody(Body, kw_only=True):
    """A rate of the group through one dispatcher: at least one of its periods."""

    dispatcher: Annotated[
        str,
        Meta(
            pattern=words_for_pattern(
                rf"^({PROVIDER.pattern}|\*)$",
                "A provider's name (smtp, amazon_ses, ...) or '*' (every dispatcher).",
            ),
            description="The dispatcher's provider (smtp, amazon_ses, ...), or `*`: every "
            "dispatcher without a rate of its own.",
        ),
    ] = "*"
    per_second: Messages | None = None
    per_minute: Messages | None = None
    per_hour: Messages | None = None


Rates = Annotated[
    list[RateBody],
    Meta(
        max_length=50,
        description="The messages to this group all workers together send through each "
        "dispatcher, each dispatcher once; the tightest period holds. Empty: not held.",
    ),
]


class MailboxProviderCreateBody(Body, kw_only=True):
    slug: GroupSlug
    name: GroupName
    domains: Domains = []
    mx_hosts: MxHosts = []
    rates: Rates = []


class MailboxProviderChangeBody(Body, kw_only=True):
    """Any of a group's fields but its slug (rates, plans and holds name it)."""

    name: GroupName | UnsetType = UNSET
    domains: Domains | UnsetType = UNSET
    mx_hosts: MxHosts | UnsetType = UNSET
    rates: Rates | UnsetType = UNSET


WarmupDomain = Annotated[
    str,
    Meta(
        min_length=1,
        max_length=253,
        description="The sending domain (DEFAULT_FROM_EMAIL's is the one email goes out from): "
        "lowercase labels of letters, digits and '-', such as mail.example.com.",
    ),
]
WarmupTimeZone = Annotated[
    TimeZone, Meta(description="The IANA time zone its days start in (default UTC).")
]
StartsOn = Annotated[date, Meta(description="Its first day (default: today, UTC).")]
Volumes = Annotated[
    dict[
        str,
        Annotated[
            # The bounds in the schema; the rule refuses a volume out of them naming the group
            # and the day (a dict's key is no part of a decoding error's path).
            list[Annotated[int, Meta(extra_json_schema={"minimum": 1, "maximum": VOLUME_MAX})]],
            Meta(min_length=1, max_length=DAYS_MAX),
        ],
    ],
    Meta(
        min_length=1,
        max_length=GROUPS_MAX,
        description="Per mailbox provider (its slug), its volume for each day from the first: "
        '{"gmail": [50, 100, ...]}; after the last day, the last holds until a day reaches it. '
        "A group not named is not held.",
    ),
]


class WarmupCreateBody(Body, kw_only=True):
    domain: WarmupDomain
    time_zone: WarmupTimeZone = "UTC"
    starts_on: StartsOn | UnsetType = UNSET
    volumes: (
        Annotated[
            Volumes, Meta(description="Left out: the default ramp for every group but other.")
        ]
        | UnsetType
    ) = UNSET


class WarmupChangeBody(Body, kw_only=True):
    """Any of a plan's fields; a group whose ramp changes starts its ramp again."""

    domain: WarmupDomain | UnsetType = UNSET
    time_zone: WarmupTimeZone | UnsetType = UNSET
    starts_on: StartsOn | UnsetType = UNSET
    volumes: Volumes | UnsetType = UNSET
