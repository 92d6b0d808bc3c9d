"""The experiments report (`GET /api/v1/reports/experiments/<id>/`, the admin's page): per arm
of a cap experiment, or for the global control group against its treatment sample, over a
period of UTC days: the users, and per user the marketing sends, each outcome event's count and
value, unsubscribes and complaints, each with a 95 % interval; the lift of each arm against the
reference (the control group's held-out users, or an experiment's first arm) with its interval
and whether it is significant; and a verdict in plain words.

It reads only the study's days (limits/studies/measures.py: a few rows per day, arm and bucket),
never the ledger, so that 90 days of 10M decisions a day answer in well under a second. The
statistics are limits/studies/lift.py's. The cohort is every user who entered up to the period's
last day; the measures are those of the period's days.
"""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

import numpy as np
from django.core.exceptions import ValidationError
from django.db.models import Sum

from limits.engine.assignment import CONTROL_GROUP, HELD, SAMPLE
from limits.models.studies import Experiment, StudyDay, StudyEvent
from limits.policy.holdout import holdout_read
from limits.studies.lift import BUCKETS, Estimate, Lift, estimate, lift, sample_ratio_p

LONGEST = 366  # days a report may span
EVENT_MAX = 64  # an event name's length (limits.studies.bodies.EventBody.name: a tag's form)
# The measures every study has, in the report's order: (key, what it is per user).
BASE_MEASURES = (
    ("sends", "marketing sends"),
    ("unsubscribes", "unsubscribes"),
    ("complaints", "complaints"),
)
# In the verdict: measures read as rates (points per 100 users) rather than relative lift.
RATES = ("unsubscribes", "complaints")
SRM_P = 0.001  # a sample ratio test below this says the split is off


@dataclass(frozen=True)
class Arm:
    place: int
    name: str
    share: float


@dataclass(frozen=True)
class Study:
    id: int  # CONTROL_GROUP for the control group
    name: str
    arms: tuple[Arm, ...]  # the reference first
    first_day: date
    last_day: date | None  # None: still running
    about: dict[str, Any]


def study_of(key: str, *, today: date) -> Study | None:
    """The study a report names: `holdout` (the control group) or an experiment's id; None for
    none."""
    if key == "holdout":
        group = holdout_read()
        first = StudyDay.objects.filter(study=CONTROL_GROUP).order_by("day").first()
        return Study(
            id=CONTROL_GROUP,
            name="The global control group",
            arms=(
                Arm(HELD, "control group (held out)", group.share),
                Arm(SAMPLE, "treatment sample", group.share),
            ),
            first_day=first.day if first is not None else today,
            last_day=None,
            about={"id": "holdout", "kind": "control_group", "share": group.share},
        )
    if not key.isdigit() or len(key) > 18:
        return None
    row = Experiment.objects.filter(pk=int(key)).select_related("segment").first()
    if row is None:
        return None
    ended = min(row.ends_at, row.stopped_at or row.ends_at)
    return Study(
        id=row.pk,
        name=row.name,
        arms=tuple(Arm(arm.position, arm.name, arm.share) for arm in row.arms.all()),
        first_day=row.starts_at.astimezone(UTC).date(),
        last_day=(ended - timedelta(microseconds=1)).astimezone(UTC).date(),
        about={
            "id": row.pk,
            "kind": "experiment",
            "name": row.name,
            "segment": row.segment.slug if row.segment is not None else None,
            "starts_at": row.starts_at,
            "ends_at": row.ends_at,
            "stopped_at": row.stopped_at,
        },
    )


def report_period(
    study: Study, params: Mapping[str, Sequence[str]], *, today: date
) -> tuple[date, date, str | None]:
    """The period asked (`from`, `to`: UTC days, both included; default: the study's days up
    to today) and the event the verdict reads (`event`); a ValidationError naming each bad
    parameter."""
    from limits.ledger.reports import day_of

    errors: dict[str, list[str]] = {}
    days: dict[str, date | None] = {}
    for name in ("from", "to"):
        values = params.get(name) or []
        days[name] = None
        if values:
            days[name] = day_of(values[-1])
            if days[name] is None:
                errors[name] = [f"'{values[-1][:40]}' is not a day: write YYYY-MM-DD (UTC)."]
    end = days["to"] or min(today, study.last_day or today)
    start = days["from"] or (study.first_day if study.id != CONTROL_GROUP else
                             max(study.first_day, end - timedelta(days=29)))  # fmt: skip
    if not errors and end < start and days["to"] is None and days["from"] is None:
        end = start  # not started yet: its first day, with nobody in it
    if not errors and end < start:
        errors["to"] = ["On or after `from`."]
    elif not errors and (end - start).days >= LONGEST:
        errors["to"] = [f"At most {LONGEST} days from `from`."]
    asked = params.get("event") or []
    event = asked[-1] if asked else None
    if event is not None and len(event) > EVENT_MAX:
        errors["event"] = [f"At most {EVENT_MAX} characters: an event's name."]
    if errors:
        raise ValidationError(errors)
    return start, end, event


def _grid(rows: Sequence[Mapping[str, Any]], arms: int, field: str) -> np.ndarray:
    grid = np.zeros((arms, BUCKETS), dtype=np.float64)
    for row in rows:
        if row["arm"] < arms and row["bucket"] < BUCKETS:
            grid[row["arm"], row["bucket"]] += row[field] or 0
    return grid


def _figures(value: Estimate) -> dict[str, Any]:
    return {"mean": value.mean, "low": _finite(value.low), "high": _finite(value.high)}


def _finite(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else value


def _lift_figures(found: Lift | None) -> dict[str, Any] | None:
    if found is None:
        return None
    return {
        "difference": found.difference,
        "low": found.low,
        "high": found.high,
        "relative": found.relative,
        "relative_low": found.relative_low,
        "relative_high": found.relative_high,
        "p_value": found.p_value,
        "significant": found.significant,
    }


def study_report(
    study: Study, *, start: date, end: date, event: str | None = None
) -> dict[str, Any]:
    """The report of `study` over `start` to `end` (UTC days, both included)."""
    count = max((arm.place for arm in study.arms), default=-1) + 1
    entered = list(
        StudyDay.objects.filter(study=study.id, day__lte=end)
        .values("arm", "bucket")
        .annotate(entered=Sum("entered"))
    )
    period = list(
        StudyDay.objects.filter(study=study.id, day__gte=start, day__lte=end)
        .values("arm", "bucket")
        .annotate(
            sends=Sum("sends"), unsubscribes=Sum("unsubscribes"), complaints=Sum("complaints")
        )
    )
    events = list(
        StudyEvent.objects.filter(study=study.id, day__gte=start, day__lte=end)
        .values("arm", "bucket", "name")
        .annotate(count=Sum("count"), value=Sum("value"))
    )
    users = _grid(entered, count, "entered")
    measures: dict[str, tuple[str, np.ndarray]] = {
        key: (words, _grid(period, count, key)) for key, words in BASE_MEASURES
    }
    names = sorted({row["name"] for row in events})
    totals = {name: sum(r["count"] for r in events if r["name"] == name) for name in names}
    for name in names:
        mine = [row for row in events if row["name"] == name]
        measures[name] = (f"{name} (conversions)", _grid(mine, count, "count"))
        measures[f"{name}.value"] = (f"{name} value", _grid(mine, count, "value"))
    reference = study.arms[0]
    arms = []
    for arm in study.arms:
        figures = {}
        lifts: dict[str, Any] | None = {} if arm is not reference else None
        for key, (_, grid) in measures.items():
            figures[key] = _figures(estimate(users[arm.place], grid[arm.place]))
            if lifts is not None:
                lifts[key] = _lift_figures(
                    lift(
                        users[arm.place],
                        grid[arm.place],
                        users[reference.place],
                        grid[reference.place],
                    )
                )
        arms.append(
            {
                "name": arm.name,
                "share": arm.share,
                "users": int(users[arm.place].sum()),
                "measures": figures,
                "lift": lifts,
            }
        )
    split = sample_ratio_p([int(users[a.place].sum()) for a in study.arms],
                           [a.share for a in study.arms])  # fmt: skip
    main = event if event in names else (max(names, key=lambda n: totals[n]) if names else None)
    answer = {
        "study": study.about,
        "from": start,
        "to": end,
        "reference": reference.name,
        "measures": [{"key": key, "per_user": words} for key, (words, _) in measures.items()],
        "arms": arms,
        "sample_ratio_p": split,
        "split_off": split is not None and split < SRM_P,
    }
    answer["verdict"] = verdict(answer, main)
    return answer


def _percent(value: float) -> str:
    return f"{value * 100:.1f}%"


def verdict(report: Mapping[str, Any], event: str | None) -> str:
    """The report in plain words: per arm against the reference, the main event's relative
    lift with its interval, and the unsubscribes' difference in points."""
    arms = report["arms"]
    if not arms or all(a["users"] == 0 for a in arms):
        return (
            "No user has entered yet: a user enters with their first marketing send while it runs."
        )
    reference = report["reference"]
    said = []
    if report.get("split_off"):
        said.append(
            "Careful: the arms' sizes are not what their shares say (a sample ratio mismatch, "
            f"p = {report['sample_ratio_p']:.2g}): something treats the arms differently, and "
            "the figures below may not compare like with like."
        )
    for arm in arms[1:]:
        parts = []
        for key, noun in ((event, f"{event}s" if event else ""), ("sends", "marketing sends")):
            if key is None:
                continue
            found = (arm["lift"] or {}).get(key)
            if found is None or found["relative"] is None:
                continue
            more = "more" if found["relative"] >= 0 else "fewer"
            part = (
                f"{_percent(abs(found['relative']))} {more} {noun} per user "
                f"(95% CI {_percent(found['relative_low'])} to {_percent(found['relative_high'])})"
            )
            if not found["significant"]:
                part += ", which could be chance"
            parts.append(part)
        for key in RATES:
            found = (arm["lift"] or {}).get(key)
            if found is None:
                continue
            points = found["difference"] * 100
            if abs(points) < 0.005 and not found["significant"]:
                continue  # nothing to say: it would read "0.00 points"
            part = (
                f"{abs(points):.2f} points {'more' if points >= 0 else 'fewer'} {key} per 100 users"
            )
            if not found["significant"]:
                part += " (not significant)"
            parts.append(part)
        if not parts:
            said.append(
                f"'{arm['name']}': too few users or events yet to compare with '{reference}'."
            )
        else:
            said.append(
                f"'{arm['name']}' brought " + ", and ".join(parts) + f" than '{reference}'."
            )
    return " ".join(said)


CSV_COLUMNS = [
    "arm", "measure", "users", "mean", "low", "high", "difference", "difference_low",
    "difference_high", "relative", "relative_low", "relative_high", "p_value", "significant",
]  # fmt: skip


def report_rows(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The report as rows for CSV: an arm and a measure a row."""
    rows = []
    for arm in report["arms"]:
        for measure in report["measures"]:
            key = measure["key"]
            figures = arm["measures"][key]
            found = (arm["lift"] or {}).get(key) or {}
            rows.append({
                "arm": arm["name"], "measure": key, "users": arm["users"], **figures,
                "difference": found.get("difference"), "difference_low": found.get("low"),
                "difference_high": found.get("high"), "relative": found.get("relative"),
                "relative_low": found.get("relative_low"),
                "relative_high": found.get("relative_high"), "p_value": found.get("p_value"),
                "significant": found.get("significant"),
            })  # fmt: skip
    return rows


def today_utc() -> date:
    return datetime.now(UTC).date()
