"""The decisions report: how many gate decisions there were by UTC day, campaign, segment,
channel and reason, for `GET /api/v1/reports/decisions/`, the dashboard's chart of refused sends
and its CSV download.

It reads the ledger's hourly counts (`LedgerCount`, written by the drain in the transaction that
writes the decisions), never the ledger itself: what it costs grows with the count rows, not the
sends (bench/reports.py: 30 days of a 10-million-a-day mix, about a thousand rows an hour, group
in well under a second). A day is a UTC day: the 24 hourly rows from its midnight, UTC.
"""

import csv
import io
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import validate_slug
from django.db import connection, transaction
from django.db.models import BigIntegerField, Sum
from django.db.models.functions import Cast, TruncDate

from limits.channels import channel_problem
from limits.models.ledger import LedgerCount
from limits.policy.rules import CAMPAIGN_MAX
from limits.reasons import REASONS, REFUSED

# What a report can group by, in the order of its columns unless `group_by` gives another.
GROUPS = ("day", "campaign", "segment", "channel", "reason")
DEFAULT_GROUP_BY = ("day", "reason")
DEFAULT_DAYS = 30
DAY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
SEGMENT_MAX = LedgerCount._meta.get_field("segment").max_length or 64
# Filters a query string may repeat for several values (`?reason=cap&reason=blocked`).
FILTERS = ("campaign", "segment", "channel", "reason")
SLUG = "^[-a-zA-Z0-9_]+$"  # a segment's (django.core.validators.validate_slug)
# A spreadsheet reads a cell that starts with one of these as a formula (CSV injection): such a
# campaign or segment is written with a leading apostrophe, as OWASP advises.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
# PostgreSQL's memory for a report's grouping (its default, 4 MB, spills the sort of 30 days of
# counts to disk and takes twice as long; bench/reports.py). Per query, for reports only.
WORK_MEM = "64MB"


@dataclass(frozen=True)
class DecisionsQuery:
    """A report: UTC days `start` to `end` (both included), grouped by `group_by` (in that
    order; empty: one total), keeping only the decisions of the filters given (empty: any)."""

    start: date
    end: date
    group_by: tuple[str, ...] = DEFAULT_GROUP_BY
    campaigns: tuple[str, ...] = ()
    segments: tuple[str, ...] = ()
    channels: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()


def first_day_kept(*, now: datetime | None = None) -> date:
    """The oldest UTC day a report covers: GATEKEEPER_LEDGER_DAYS days, today's included.
    (ledger_upkeep drops the rows and counts older than GATEKEEPER_LEDGER_DAYS days back from
    now: the day before this one is still whole, but only until the next midnight.)"""
    now = now or datetime.now(tz=UTC)
    return now.astimezone(UTC).date() - timedelta(days=int(settings.GATEKEEPER_LEDGER_DAYS) - 1)


def decisions_query(
    params: Mapping[str, Sequence[str]], *, now: datetime | None = None
) -> DecisionsQuery:
    """The report a query string asks for (`dict(request.GET.lists())`), by the one rule for
    it, REST and admin alike, as strict as the schema says (tests/gatekeeper/test_api_fuzz.py
    holds the server to it). A ValidationError names each bad field ({"from": [...]}).

    - `from`, `to`: UTC days (YYYY-MM-DD), both included. Neither: the last DEFAULT_DAYS days,
      today (UTC) included; one of them: DEFAULT_DAYS days from `from` or up to `to`. At most
      GATEKEEPER_LEDGER_DAYS days, none before `first_day_kept`.
    - `group_by`: names of GROUPS, comma-separated, in the order wanted; absent:
      DEFAULT_GROUP_BY; empty: no grouping (one total).
    - `campaign`, `segment`, `channel`, `reason`: only these decisions, each repeated for
      several (`?reason=cap&reason=blocked`); `campaign=` (empty) means decisions of no
      campaign. Unknown parameters are left alone (`format` is the renderer's)."""
    now = now or datetime.now(tz=UTC)
    errors: dict[str, list[str]] = {}

    def last(name: str) -> str | None:
        values = params.get(name) or []
        return values[-1] if values else None

    days: dict[str, date | None] = {}
    for name in ("from", "to"):
        text = last(name)
        days[name] = None
        if text is None:
            continue
        days[name] = day_of(text)
        if days[name] is None:
            errors[name] = [f"'{text[:40]}' is not a day: write YYYY-MM-DD (a UTC day)."]

    group_by: tuple[str, ...] = DEFAULT_GROUP_BY
    text = last("group_by")
    if text is not None:
        names = text.split(",") if text else []
        unknown = [name for name in names if name not in GROUPS]
        if unknown:
            errors["group_by"] = [
                f"Unknown field '{unknown[0][:40]}'. Group by any of: {', '.join(GROUPS)} "
                "(comma-separated)."
            ]
        group_by = tuple(dict.fromkeys(names))  # named twice is meant once

    filters: dict[str, tuple[str, ...]] = {}
    for name in FILTERS:
        values = list(params.get(name) or [])
        problem = next((p for p in map(FILTER_PROBLEMS[name], values) if p), None)
        if problem:
            errors[name] = [problem]
        filters[name] = tuple(dict.fromkeys(values))

    start, end = _interval(days["from"], days["to"], now=now, errors=errors)
    if errors:
        raise ValidationError(errors)
    return DecisionsQuery(
        start=start,
        end=end,
        group_by=group_by,
        campaigns=filters["campaign"],
        segments=filters["segment"],
        channels=filters["channel"],
        reasons=filters["reason"],
    )


def day_of(text: str) -> date | None:
    """The one rule for a UTC day in a query (`2026-11-24`): the day, or None for anything
    else."""
    if DAY.fullmatch(text) is None:
        return None
    try:
        return date.fromisoformat(text)
    except ValueError:
        return None


def _campaign_problem(value: str) -> str | None:
    if "\x00" in value:
        # PostgreSQL text cannot hold it: no decision has it, and the query could not be sent.
        return "Must not contain the NUL character (\\u0000)."
    if len(value) > CAMPAIGN_MAX:
        return f"At most {CAMPAIGN_MAX} characters."
    return None


def _segment_problem(value: str) -> str | None:
    try:
        validate_slug(value)
    except ValidationError:
        return f"'{value[:40]}' is no segment: a segment's slug is letters, digits, - and _."
    if len(value) > SEGMENT_MAX:
        return f"'{value[:40]}…' is no segment: a slug has at most {SEGMENT_MAX} characters."
    return None


def _reason_problem(value: str) -> str | None:
    if value not in REASONS:
        return f"Unknown reason '{value[:40]}'. Choose one of: {', '.join(REASONS)}."
    return None


# What is wrong with a value of a filter of the ledger's decisions (the report's and a user's
# history's), in words; None: nothing.
FILTER_PROBLEMS: dict[str, Callable[[str], str | None]] = {
    "campaign": _campaign_problem,
    "segment": _segment_problem,
    "channel": channel_problem,
    "reason": _reason_problem,
}


def _plus(day: date, days: int) -> date:
    """`day` moved by `days`, stopping at the calendar's ends (year 1, year 9999)."""
    try:
        return day + timedelta(days=days)
    except OverflowError:
        return date.max if days > 0 else date.min


def _interval(
    start: date | None, end: date | None, *, now: datetime, errors: dict[str, list[str]]
) -> tuple[date, date]:
    """The days asked for, defaults filled in; a problem with the range goes in `errors`, under
    the fields the caller gave (the defaults make none)."""
    oldest = first_day_kept(now=now)
    kept = int(settings.GATEKEEPER_LEDGER_DAYS)
    given = [name for name, day in (("from", start), ("to", end)) if day is not None]
    span = min(DEFAULT_DAYS, kept) - 1
    if end is None:
        end = now.astimezone(UTC).date() if start is None else _plus(start, span)
    if start is None:
        start = max(_plus(end, -span), oldest)
    problem = None
    if min(start, end) < oldest:
        problem = (
            f"The ledger keeps {kept} days (GATEKEEPER_LEDGER_DAYS), today's included: the "
            f"oldest is {oldest}, and {min(start, end)} is before it."
        )
    elif start > end:
        problem = f"The range ends before it starts: {start} is after {end}."
    elif (end - start).days + 1 > kept:
        problem = (
            f"At most {kept} days (GATEKEEPER_LEDGER_DAYS, what the ledger keeps): "
            f"{start} to {end} is {(end - start).days + 1} days."
        )
    for name in given if problem else []:
        errors[name] = [str(problem)]
    return start, end


def _midnight(day: date) -> datetime:
    return datetime.combine(day, time(), tzinfo=UTC)


def decisions_report(*, query: DecisionsQuery) -> list[dict[str, Any]]:
    """The report's rows: per combination of the grouped fields that has decisions, those fields
    (`day` as YYYY-MM-DD, in `query.group_by`'s order) and `count`, ordered by the grouped
    fields (text by code point, on every database). Without grouping, one row: the total (0
    for none)."""
    counts = LedgerCount.objects.filter(hour__gte=_midnight(query.start))
    if query.end < date.max:
        counts = counts.filter(hour__lt=_midnight(query.end + timedelta(days=1)))
    for field, values in (
        ("campaign", query.campaigns),
        ("segment", query.segments),
        ("channel", query.channels),
        ("reason", query.reasons),
    ):
        if values:
            counts = counts.filter(**{f"{field}__in": values})
    postgresql = connection.vendor == "postgresql"
    with transaction.atomic(), connection.cursor() as cursor:
        if postgresql:
            cursor.execute(f"SET LOCAL work_mem = '{WORK_MEM}'")
        if not query.group_by:
            total = counts.aggregate(total=Sum("count"))["total"]
            return [{"count": int(total or 0)}]
        if "day" in query.group_by:
            # The day of a UTC hour, whatever TIME_ZONE is: a date on PostgreSQL (formatted
            # below, once a row), YYYY-MM-DD text on SQLite.
            counts = counts.annotate(day=TruncDate("hour", tzinfo=UTC))
        grouped = (
            counts.values_list(*query.group_by)
            # Not `count`: LedgerCount has a field of that name. PostgreSQL's SUM of a bigint
            # is a numeric.
            .annotate(total=Cast(Sum("count"), BigIntegerField()))
            .order_by()
        )
        inner, params = grouped.query.sql_with_params()
        # Sorted around the grouping, by code point: ordering the grouped query itself would
        # make Django group by each collated column too, and PostgreSQL's own collation is
        # slower to sort by and ignores punctuation (bench/reports.py).
        quote = connection.ops.quote_name
        collation = '"C"' if postgresql else "BINARY"
        columns = [quote(name) for name in [*query.group_by, "total"]]
        order = [
            quote(name) if name == "day" else f"{quote(name)} COLLATE {collation}"
            for name in query.group_by
        ]
        if postgresql and "day" in query.group_by:
            columns[query.group_by.index("day")] = "to_char(\"day\", 'YYYY-MM-DD')"
        cursor.execute(
            f"SELECT {', '.join(columns)} FROM ({inner}) AS report ORDER BY {', '.join(order)}",
            params,
        )
        found = cursor.fetchall()
    names = report_columns(query)
    return [dict(zip(names, row, strict=True)) for row in found]


def report_columns(query: DecisionsQuery) -> list[str]:
    return [*query.group_by, "count"]


def decisions_csv(rows: Iterable[Mapping[str, Any]], *, columns: Sequence[str]) -> str:
    """The report as CSV: a header row of `columns`, then a line per row."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_cell(row[name]) for name in columns])
    return out.getvalue()


def _cell(value: Any) -> Any:
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return f"'{value}"
    return value


def report_filename(query: DecisionsQuery) -> str:
    return f"decisions-{query.start}-{query.end}.csv"


@dataclass(frozen=True)
class DaySeries:
    """Counts per day of the keys of one field (a chart's stacked bars): `series` holds the
    keys with the most decisions first, each with a count per day of `days`; `others` sums the
    keys beyond the top ones (None when there are none)."""

    days: list[date]
    series: list[tuple[str, list[int]]]
    others: list[int] | None

    @property
    def total(self) -> int:
        return sum(sum(values) for _, values in self.series) + sum(self.others or [])


def report_days(query: DecisionsQuery) -> list[date]:
    return [query.start + timedelta(days=n) for n in range((query.end - query.start).days + 1)]


def day_series(
    rows: Iterable[Mapping[str, Any]], *, days: Sequence[date], by: str, top: int | None = None
) -> DaySeries:
    """A report's rows grouped by day (and more) as counts per day of `days` for each value of
    the field `by` (`campaign`, `reason`, ...): the `top` values with the most decisions on
    their own (reasons in REASONS' order, so that a chart's colours stay put; others by count),
    the rest together."""
    place = {day.isoformat(): n for n, day in enumerate(days)}
    per_key: dict[str, list[int]] = {}
    totals: Counter[str] = Counter()
    for row in rows:
        key = row[by]
        per_key.setdefault(key, [0] * len(days))[place[row["day"]]] += row["count"]
        totals[key] += row["count"]
    order: list[str]
    if by == "reason":
        order = [reason for reason in REASONS if reason in per_key]
    else:
        order = sorted(per_key, key=lambda key: (-totals[key], key))
    shown = order if top is None else order[:top]
    rest = order[len(shown) :]
    others = [sum(per_key[key][n] for key in rest) for n in range(len(days))] if rest else None
    return DaySeries(days=list(days), series=[(key, per_key[key]) for key in shown], others=others)


# The campaigns with the most refused sends get a colour each on the chart, the others one
# together ("other campaigns"): the palette's 8 colours, the last grey.
REFUSED_CAMPAIGNS_SHOWN = 7
NO_CAMPAIGN = "(no campaign)"


def refused_history() -> dict[str, Any] | None:
    """The refused sends of the last DEFAULT_DAYS UTC days (the decisions report's default
    range), per day, by reason and by campaign, from the ledger's counts; None when there were
    none. One query: grouped by day, campaign and reason, both charts are sums of it."""
    query = decisions_query({"reason": REFUSED, "group_by": ["day,campaign,reason"]})
    rows = decisions_report(query=query)
    days = report_days(query)
    by_reason = day_series(rows, days=days, by="reason")
    if not by_reason.total:
        return None
    by_campaign = day_series(rows, days=days, by="campaign", top=REFUSED_CAMPAIGNS_SHOWN)
    campaigns = [
        {"label": key or NO_CAMPAIGN, "values": values} for key, values in by_campaign.series
    ]
    if by_campaign.others is not None:
        campaigns.append({"label": "other campaigns", "values": by_campaign.others})
    return {
        "days": [day.isoformat() for day in days],
        "from": query.start.isoformat(),
        "to": query.end.isoformat(),
        "total": by_reason.total,
        "reasons": [{"label": key, "values": values} for key, values in by_reason.series],
        "campaigns": campaigns,
    }
