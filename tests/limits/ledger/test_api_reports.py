"""The decisions report: counts of gate decisions by UTC day, campaign, segment, channel and
reason, read from the ledger's hourly counts; over HTTP (JSON and CSV, rights, bad input) and
through its selector (every grouping, filters, day boundaries, defaults, with `now` given)."""

import csv
import io
from datetime import UTC, date, datetime, timedelta
from itertools import combinations

import pytest
from django.core.exceptions import ValidationError

from limits.ledger.drain import ledger_drain_all
from limits.ledger.reports import (
    GROUPS,
    DecisionsQuery,
    day_series,
    decisions_csv,
    decisions_query,
    decisions_report,
    report_days,
)
from limits.models.ledger import LedgerCount
from tests.support.api import call
from worker.gate import gate_check

URL = "/api/v1/reports/decisions/"
NOW = datetime(2026, 11, 24, 15, 30, tzinfo=UTC)
DAY = timedelta(days=1)
HOUR = timedelta(hours=1)


def midnight(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def today() -> date:
    return datetime.now(tz=UTC).date()


def count(
    hour: datetime, n: int, *, channel="email", campaign="spring", segment="vip", reason="allowed"
):
    return LedgerCount.objects.create(
        hour=hour, channel=channel, campaign=campaign, segment=segment, reason=reason, count=n
    )


def report(**params: str | list[str]) -> list[dict]:
    """The report's rows at NOW for these query parameters."""
    lists = {name: value if isinstance(value, list) else [value] for name, value in params.items()}
    return decisions_report(query=decisions_query(lists, now=NOW))


def refused(**params: str | list[str]) -> dict[str, list[str]]:
    """The 400's problems at NOW for these query parameters."""
    lists = {name: value if isinstance(value, list) else [value] for name, value in params.items()}
    with pytest.raises(ValidationError) as caught:
        decisions_query(lists, now=NOW)
    return caught.value.message_dict


# --- the selector -----------------------------------------------------------------------------


@pytest.fixture
def mix(db):
    """Two UTC days before NOW's, in two campaigns, segments, channels and reasons."""
    d1 = midnight(NOW.date() - 2 * DAY)
    d2 = d1 + DAY
    count(d1, 5)
    count(d1 + HOUR, 2, reason="daily_cap")
    count(d1 + 23 * HOUR, 1, segment="default")  # the day's last hour
    count(d2, 7, channel="push")  # the next day's first hour
    count(d2 + 5 * HOUR, 3, campaign="autumn", reason="daily_cap")
    count(d2 + 6 * HOUR, 4, campaign="", segment="default", reason="exempt")
    return d1.date(), d2.date()


@pytest.mark.postgres
def test_it_groups_by_day_and_reason_unless_told_otherwise(mix):
    d1, d2 = mix
    assert report() == [
        {"day": str(d1), "reason": "allowed", "count": 6},
        {"day": str(d1), "reason": "daily_cap", "count": 2},
        {"day": str(d2), "reason": "allowed", "count": 7},
        {"day": str(d2), "reason": "daily_cap", "count": 3},
        {"day": str(d2), "reason": "exempt", "count": 4},
    ]


@pytest.mark.postgres
@pytest.mark.parametrize(
    "group_by", [c for n in range(len(GROUPS) + 1) for c in combinations(GROUPS, n)]
)
def test_every_grouping_sums_the_same_counts_by_its_fields(mix, group_by):
    rows = report(group_by=",".join(group_by))
    assert sum(row["count"] for row in rows) == 22
    assert all(list(row) == [*group_by, "count"] for row in rows)
    # Each row is the sum of the hourly counts that share its fields.
    expected: dict[tuple, int] = {}
    for c in LedgerCount.objects.all():
        fields = {"day": c.hour.date().isoformat(), "campaign": c.campaign, "segment": c.segment,
                  "channel": c.channel, "reason": c.reason}  # fmt: skip
        key = tuple(fields[name] for name in group_by)
        expected[key] = expected.get(key, 0) + c.count
    assert {tuple(row[name] for name in group_by): row["count"] for row in rows} == expected
    assert rows == sorted(rows, key=lambda row: [row[name] for name in group_by])


@pytest.mark.postgres
def test_the_order_of_group_by_is_the_order_of_columns_and_rows(mix):
    d1, d2 = mix
    assert report(group_by="reason,day", reason=["daily_cap", "exempt"]) == [
        {"reason": "daily_cap", "day": str(d1), "count": 2},
        {"reason": "daily_cap", "day": str(d2), "count": 3},
        {"reason": "exempt", "day": str(d2), "count": 4},
    ]
    # Named twice: meant once; given twice: the last.
    assert report(group_by=["day", "reason,day,reason"], reason=["exempt", "daily_cap"]) == report(
        group_by="reason,day", reason=["daily_cap", "exempt"]
    )


@pytest.mark.postgres
def test_rows_are_in_code_point_order_on_every_database(db):
    names = ["é-promo", "alpha", "Zeta", "_internal", "-dash", "zeta", "10", "9"]
    for n, name in enumerate(names):
        count(midnight(NOW.date()), n + 1, campaign=name)
    found = [row["campaign"] for row in report(group_by="campaign")]
    assert (
        found
        == sorted(names)
        == ["-dash", "10", "9", "Zeta", "_internal", "alpha", "zeta", "é-promo"]
    )


@pytest.mark.postgres
def test_an_empty_group_by_is_one_total_even_of_nothing(mix):
    assert report(group_by="") == [{"count": 22}]
    assert report(group_by="", campaign="nothing-like-it") == [{"count": 0}]
    assert report(group_by="day", campaign="nothing-like-it") == []


@pytest.mark.postgres
def test_filters_keep_only_their_decisions(mix):
    _, d2 = mix
    assert report(group_by="campaign", campaign="autumn") == [{"campaign": "autumn", "count": 3}]
    # An empty campaign: the decisions of none (the exempt transactional ones here).
    assert report(group_by="reason", campaign="") == [{"reason": "exempt", "count": 4}]
    assert report(group_by="", campaign=["spring", "autumn"]) == [{"count": 18}]
    assert report(group_by="day", channel="push") == [{"day": str(d2), "count": 7}]
    assert report(group_by="segment", segment="default") == [{"segment": "default", "count": 5}]
    assert report(group_by="", segment=["vip", "default"]) == [{"count": 22}]
    assert report(group_by="", reason="daily_cap", channel="email", campaign="spring") == [
        {"count": 2}
    ]


@pytest.mark.postgres
def test_days_are_utc_days_whatever_the_time_zone_setting(mix, settings):
    settings.TIME_ZONE = "Pacific/Kiritimati"  # UTC+14: local days would cut elsewhere
    d1, d2 = mix
    # 23:00 UTC belongs to its own day, 00:00 UTC to the next.
    assert report(group_by="day") == [{"day": str(d1), "count": 8}, {"day": str(d2), "count": 14}]
    assert report(group_by="", **{"from": str(d1), "to": str(d1)}) == [{"count": 8}]
    assert report(group_by="", **{"from": str(d2), "to": str(d2)}) == [{"count": 14}]


@pytest.mark.postgres
def test_from_and_to_are_both_included(db):
    first, last = date(2026, 11, 1), date(2026, 11, 3)
    count(midnight(first) - HOUR, 1)  # the evening before
    count(midnight(first), 10)
    count(midnight(last) + 23 * HOUR, 100)
    count(midnight(last) + DAY, 1000)  # the morning after
    assert report(group_by="", **{"from": str(first), "to": str(last)}) == [{"count": 110}]
    assert report(group_by="day", **{"from": str(last), "to": str(last)}) == [
        {"day": str(last), "count": 100}
    ]


def test_without_dates_the_last_30_days_today_included(db):
    query = decisions_query({}, now=NOW)
    assert (query.start, query.end) == (date(2026, 10, 26), date(2026, 11, 24))
    assert query.group_by == ("day", "reason")
    # Just before midnight UTC it is still that day.
    late = decisions_query({}, now=datetime(2026, 11, 24, 23, 59, 59, tzinfo=UTC))
    assert late.end == date(2026, 11, 24)
    # One of the two: 30 days from `from`, or up to `to`.
    after = decisions_query({"from": ["2026-10-01"]}, now=NOW)
    assert (after.start, after.end) == (date(2026, 10, 1), date(2026, 10, 30))
    before = decisions_query({"to": ["2026-10-30"]}, now=NOW)
    assert (before.start, before.end) == (date(2026, 10, 1), date(2026, 10, 30))


def test_the_default_range_stays_within_what_the_ledger_keeps(db, settings):
    settings.GATEKEEPER_LEDGER_DAYS = 7
    query = decisions_query({}, now=NOW)
    assert (query.start, query.end) == (date(2026, 11, 18), date(2026, 11, 24))
    assert decisions_query({"to": ["2026-11-20"]}, now=NOW).start == date(2026, 11, 18)
    after = decisions_query({"from": ["2026-11-20"]}, now=NOW)
    assert (after.start, after.end) == (date(2026, 11, 20), date(2026, 11, 26))


@pytest.mark.parametrize(
    ("params", "field", "message"),
    [
        ({"from": "2026-11-31"}, "from", "'2026-11-31' is not a day: write YYYY-MM-DD"),
        ({"to": "24/11/2026"}, "to", "'24/11/2026' is not a day"),
        ({"from": "20261124"}, "from", "is not a day"),  # ISO, but not this form
        ({"from": "2026-11-24T00:00"}, "from", "is not a day"),
        ({"from": "2026-11-20", "to": "2026-11-10"}, "to", "ends before it starts: 2026-11-20 is after 2026-11-10"),
        ({"from": "2026-11-20", "to": "2026-11-10"}, "from", "ends before it starts"),
        ({"from": "2026-11-01", "to": "2027-03-01"}, "to", "At most 90 days (GATEKEEPER_LEDGER_DAYS"),
        ({"from": "2026-08-26"}, "from", "the oldest is 2026-08-27, and 2026-08-26 is before it"),
        ({"to": "2025-01-01"}, "to", "2025-01-01 is before it"),
        ({"group_by": "day,weekday"}, "group_by", "Unknown field 'weekday'. Group by any of: day, campaign, segment, channel, reason (comma-separated)."),
        ({"group_by": "Day"}, "group_by", "Unknown field 'Day'"),
        ({"channel": "fax"}, "channel", "Unknown channel 'fax'. Choose one of: email, push, sms."),
        ({"channel": ["email", "all"]}, "channel", "Unknown channel 'all'"),
        ({"channel": "email,push"}, "channel", "Unknown channel 'email,push'"),
        ({"channel": ""}, "channel", "Unknown channel ''"),
        ({"reason": ""}, "reason", "Unknown reason ''"),
        ({"segment": ""}, "segment", "is no segment"),
        ({"from": ""}, "from", "'' is not a day"),
        ({"group_by": "day,,reason"}, "group_by", "Unknown field ''"),
        ({"group_by": "day, reason"}, "group_by", "Unknown field ' reason'"),
        ({"group_by": "day,"}, "group_by", "Unknown field ''"),
        ({"reason": "capped"}, "reason", "Unknown reason 'capped'. Choose one of: allowed,"),
        ({"segment": "no/such"}, "segment", "a segment's slug is letters, digits, - and _"),
        ({"segment": "s" * 65}, "segment", "at most 64 characters"),
        ({"campaign": "c" * 201}, "campaign", "At most 200 characters."),
        ({"campaign": "a\x00b"}, "campaign", "NUL"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_naming_the_field(db, params, field, message):
    problems = refused(**params)
    assert field in problems and message in problems[field][0], problems


def test_each_bad_field_is_named_at_once(db):
    assert set(refused(**{"from": "x", "group_by": "y", "reason": "z"})) == {
        "from",
        "group_by",
        "reason",
    }


@pytest.mark.postgres
def test_days_at_the_calendars_ends_are_no_error(db):
    last = decisions_query({"from": ["9999-12-20"]}, now=NOW)
    assert (last.start, last.end) == (date(9999, 12, 20), date(9999, 12, 31))
    assert report(**{"from": "9999-12-31", "to": "9999-12-31"}) == []
    assert "to" in refused(to="0001-01-01")


def test_the_oldest_day_kept_is_accepted(db):
    assert decisions_query({"from": ["2026-08-27"], "to": ["2026-11-24"]}, now=NOW).start == date(
        2026, 8, 27
    )


@pytest.mark.postgres
def test_day_series_split_days_by_a_field_the_rest_together(mix):
    d1, d2 = mix
    query = DecisionsQuery(start=d1, end=d2 + DAY, group_by=("day", "campaign", "reason"))
    rows = decisions_report(query=query)
    days = report_days(query)
    by_reason = day_series(rows, days=days, by="reason")
    assert by_reason.series == [
        ("allowed", [6, 7, 0]),
        ("daily_cap", [2, 3, 0]),
        ("exempt", [0, 4, 0]),
    ]
    by_campaign = day_series(rows, days=days, by="campaign", top=1)
    assert by_campaign.series == [("spring", [8, 7, 0])]
    assert by_campaign.others == [0, 7, 0] and by_campaign.total == 22


def test_csv_has_a_header_row_and_keeps_formulas_out(db):
    rows = [{"campaign": "=HYPERLINK(1)", "count": 3}, {"campaign": "a,b", "count": 4}]
    text = decisions_csv(rows, columns=["campaign", "count"])
    assert list(csv.reader(io.StringIO(text))) == [
        ["campaign", "count"],
        ["'=HYPERLINK(1)", "3"],
        ["a,b", "4"],
    ]


# --- over HTTP --------------------------------------------------------------------------------


def get(session, **params):
    return call(session, "GET", URL, params=params)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_decisions_made_by_the_gate_are_reported_by_utc_day(api, snapshot):
    # Around a midnight UTC, two days ago: the last half second of one day, then the next.
    boundary = midnight(today() - DAY)
    before, after = (
        boundary - timedelta(seconds=0.5),
        boundary + timedelta(seconds=0.5),
    )
    d1, d2 = str(boundary.date() - DAY), str(boundary.date())
    gate_check(
        channel="email",
        requests=[(1, "s1"), (1, "s2"), (1, "s3"), (9, "s9")],
        campaign="spring",
        now=before,
    )
    gate_check(channel="email", requests=[(9, "s9b")], campaign="spring", now=after)
    gate_check(channel="push", requests=[(2, "p2")], campaign="autumn", now=after)
    gate_check(channel="email", requests=[(9, "otp")], category="transactional", now=after)
    gate_check(channel="email", requests=[(9, "dry")], dry_run=True, now=after)  # never kept
    assert ledger_drain_all() == 7

    viewer = api("viewer")
    response = get(viewer, **{"from": d1, "to": d2, "group_by": "day,segment,reason"})
    assert response.status_code == 200, response.text
    assert response.json() == {
        "from": d1,
        "to": d2,
        "group_by": ["day", "segment", "reason"],
        "results": [
            {"day": d1, "segment": "default", "reason": "allowed", "count": 1},
            {"day": d1, "segment": "vip", "reason": "allowed", "count": 2},
            {"day": d1, "segment": "vip", "reason": "daily_cap", "count": 1},
            {"day": d2, "segment": "default", "reason": "exempt", "count": 1},
            {"day": d2, "segment": "default", "reason": "weekly_cap", "count": 1},
            {"day": d2, "segment": "vip", "reason": "allowed", "count": 1},
        ],
    }  # fmt: skip
    spring = get(
        viewer, **{"from": d1, "to": d2, "campaign": "spring", "group_by": "channel,reason"}
    )
    assert spring.json()["results"] == [
        {"channel": "email", "reason": "allowed", "count": 3},
        {"channel": "email", "reason": "daily_cap", "count": 1},
        {"channel": "email", "reason": "weekly_cap", "count": 1},
    ]
    capped = get(
        viewer,
        **{"from": d1, "to": d2, "group_by": "campaign", "reason": ["daily_cap", "weekly_cap"]},
    )
    assert capped.json()["results"] == [{"campaign": "spring", "count": 2}]
    push = get(viewer, **{"from": d2, "to": d2, "group_by": "", "channel": "push"})
    assert push.json()["results"] == [{"count": 1}]
    # The defaults: the last 30 days, today's included, by day and reason.
    first = today()
    recent = get(viewer).json()
    days = {(str(t - 29 * DAY), str(t)) for t in (first, today())}  # a midnight may pass
    assert (recent["from"], recent["to"]) in days and recent["group_by"] == ["day", "reason"]
    assert sum(row["count"] for row in recent["results"]) == 7


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_report_as_csv_with_a_header_row(api):
    day = today() - 3 * DAY
    count(midnight(day) + HOUR, 12, campaign="=1+2")
    count(midnight(day) + HOUR, 3, campaign="spring, again", reason="blocked")
    viewer = api("viewer")
    params = {"from": str(day), "to": str(day), "group_by": "day,campaign,reason"}
    for response in (
        get(viewer, **params, format="csv"),
        call(viewer, "GET", URL, params=params, headers={"Accept": "text/csv"}),
    ):
        assert response.status_code == 200
        assert response.headers["Content-Type"] == "text/csv; charset=utf-8"
        assert (
            response.headers["Content-Disposition"]
            == f'attachment; filename="decisions-{day}-{day}.csv"'
        )
        assert list(csv.reader(io.StringIO(response.text))) == [
            ["day", "campaign", "reason", "count"],
            [str(day), "'=1+2", "allowed", "12"],
            [str(day), "spring, again", "blocked", "3"],
        ]
    # Nothing to report: the header row alone; no grouping: the total.
    empty = get(viewer, **{**params, "campaign": "none"}, format="csv")
    assert empty.text == "day,campaign,reason,count\r\n"
    assert get(viewer, group_by="", format="csv").text == "count\r\n15\r\n"
    assert get(viewer, format="json").json()["results"][0]["count"] == 12


@pytest.mark.django_db(transaction=True)
def test_bad_input_is_a_400_in_the_apis_format_also_for_csv(api):
    viewer = api("viewer")
    response = get(viewer, **{"from": "2026-02-30", "group_by": "week"})
    assert response.status_code == 400
    problems = response.json()
    assert set(problems) == {"from", "group_by"}
    assert problems["group_by"] == [
        "Unknown field 'week'. Group by any of: day, campaign, segment, channel, reason (comma-separated)."
    ]
    as_csv = get(viewer, channel="fax", format="csv")
    assert as_csv.status_code == 400 and as_csv.headers["Content-Type"] == "application/json"
    assert as_csv.json()["channel"] == ["Unknown channel 'fax'. Choose one of: email, push, sms."]
    unknown = get(viewer, format="xml")
    assert unknown.status_code == 400
    assert unknown.json() == {"format": ["Unknown format 'xml'. Choose json or csv."]}
    too_long = get(viewer, **{"from": str(today() - 89 * DAY), "to": str(today() + DAY)})
    assert too_long.status_code == 400 and "At most 90 days" in too_long.json()["to"][0]
    assert get(viewer, campaign="a\x00b").status_code == 400


@pytest.mark.django_db(transaction=True)
def test_reading_the_report_needs_the_dashboards_right(api):
    assert get(api("anonymous")).status_code == 401
    assert get(api("anonymous"), format="csv").headers["Content-Type"] == "application/json"
    refused = get(api("nobody"), format="csv")
    assert refused.status_code == 403
    assert refused.json() == {"detail": "This needs the permission segments.view_segment."}
    for role in ("viewer", "marketer", "gate"):
        assert get(api(role)).status_code == 200, role
