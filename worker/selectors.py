"""Reads of the worker app: the what-if of a draft change of caps (dry runs of the gate over an
audience, and what people's own preferences would block), the dashboard's counts, and send
jobs' waiting sends, and the operator's figures of send work (/metrics). None of them writes
anything."""

import datetime as dt
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np
from django.conf import settings
from django.db.models import Count, Max, Min, Q, Sum
from django.db.models.functions import Coalesce, TruncHour

from gatekeeper.lib.instants import instant_checked, instant_ms, instant_or_now
from limits.channels import channels
from limits.engine.model import sorted_distinct
from limits.engine.table import DAY_SECONDS, WEEK_SECONDS, PolicyTable, RuleView, counting_rule
from limits.engine.topics import REQUIRED, TopicView, topic_problem
from limits.people.preferences import PreferencesUnavailable, preference_cache
from limits.policy.quota import Unavailable, live_index
from limits.policy.selectors import policy_read, topics_read
from limits.reasons import ADMITTED, REFUSED, Reason
from segments.index import SegmentIndex, get_index
from segments.parsing import UserListError, iter_ids
from worker.chunks import chunks_free, chunks_runnable_at
from worker.gate import Gate
from worker.models import SendChunk, SendJob, chunks_waiting
from worker.stats import stats_for_days

# Audience members evaluated per what-if: 4 dry runs of 100,000 take a few seconds (two
# channels, now and draft). A larger audience is estimated from a uniform random sample.
WHAT_IF_LIMIT = 100_000
# An uploaded what-if audience is read by the web process: bounded as sent, decompressed and
# in ids, so a large or inflating file is refused in about a second.
WHAT_IF_MAX_BYTES = 100 * 2**20
WHAT_IF_MAX_INFLATED = 128 * 2**20
WHAT_IF_MAX_IDS = 5_000_000


def what_if(
    *,
    ids: np.ndarray,
    draft: PolicyTable,
    only_channels: list[str] | None = None,
    now: dt.datetime | None = None,
    audience_size: int | None = None,
    campaign: str = "",
    tags: tuple[str, ...] = (),
    priority: int = 5,
) -> dict[str, Any]:
    """How many of `ids` one more send (of this campaign, tags and priority) would be refused
    now and under `draft` (the rules with a draft of caps applied), per segment and channel,
    and by which rule under the draft, against today's Redis state; and per channel and topic
    how many people's own preferences would refuse (`preferences`, see what_if_preferences).

    Dry runs only: nothing is recorded. Ids are de-duplicated; an audience above WHAT_IF_LIMIT
    is estimated from a uniform random sample of that many, scaled up (`sampled` says so).
    `audience_size`: the caller already sampled `ids` from an audience of that many. `now`: the
    instant asked about (None: Redis's clock for the logs, this process's for the rest)."""
    if now is not None:
        instant_checked(now)
    index = live_index()
    unique = sorted_distinct(np.asarray(ids, dtype=np.uint64))
    total = max(int(unique.size), audience_size or 0)
    if unique.size > WHAT_IF_LIMIT:
        unique = np.sort(np.random.default_rng().choice(unique, WHAT_IF_LIMIT, replace=False))
    sampled = total > int(unique.size)
    scale = total / max(1, int(unique.size))
    user_ids = [int(u) for u in unique]
    segments = index.resolve_many(user_ids)
    sizes = Counter(segments)
    current = policy_read()
    gate = Gate(index=index, record_stats=False)
    rows: list[dict[str, Any]] = []
    by_rule: Counter[tuple[str, str]] = Counter()
    for channel in only_channels or channels():
        requests = [(u, f"what-if:{u}") for u in user_ids]
        refused: dict[str, Counter[str]] = {}
        for name, table in (("now", current), ("draft", draft)):
            decisions = gate.check(
                channel=channel,
                requests=requests,
                campaign=campaign,
                tags=tags,
                priority=priority,
                dry_run=True,
                now=now,
                table=table,
            )
            if any(d.reason == Reason.UNAVAILABLE for d in decisions):
                raise Unavailable("Redis is not answering; the what-if cannot be run.")
            refused[name] = Counter(
                s for s, d in zip(segments, decisions, strict=True) if not d.allowed
            )
            if name == "draft":
                by_rule.update(
                    (channel, d.rule["name"] if d.rule else d.reason)
                    for d in decisions
                    if not d.allowed
                )
        for slug in sorted(sizes, key=lambda s: _priority(index, s)):
            rows.append(
                {
                    "segment": slug,
                    "channel": channel,
                    "audience": round(sizes[slug] * scale),
                    "refused_now": round(refused["now"][slug] * scale),
                    "refused_draft": round(refused["draft"][slug] * scale),
                }
            )
    rules = [
        {"channel": channel, "rule": rule, "refused": round(n * scale)}
        for (channel, rule), n in sorted(by_rule.items(), key=lambda kv: (kv[0][0], -kv[1]))
    ]
    channels_tried = only_channels or channels()
    return {
        "audience": total,
        "evaluated": len(user_ids),
        "sampled": sampled,
        "rows": rows,
        "by_rule": rules,
        "preferences": what_if_preferences(
            user_ids=user_ids,
            only_channels=channels_tried,
            topics=current.topics,
            now=now,
            scale=scale,
        ),
    }


def what_if_preferences(
    *,
    user_ids: list[int],
    only_channels: list[str],
    topics: Mapping[str, TopicView] | None = None,
    now: dt.datetime | None = None,
    scale: float = 1,
) -> list[dict[str, Any]]:
    """Per channel of `only_channels`, for a send of no topic (`topic` None) and of each topic
    sent on it, how many of `user_ids` their own preferences would refuse, by reason
    (`preference`, `paused`), times `scale` (the what-if's sample). Asks the process's copy of
    people's preferences, as the gate does: no Redis, nothing written. `required`: a topic no
    preference can block. `topics`: the topics there are, as the caller read them (None:
    read now). `now`: the instant asked about (None: this process's clock)."""
    at_ms = instant_ms(instant_or_now(now))
    topics = topics_read() if topics is None else topics
    cache = preference_cache()
    rows = []
    for channel in only_channels:
        for slug in [None, *sorted(topics)]:
            topic = topics[slug] if slug is not None else None
            if slug is not None and topic_problem(topics, slug, channel) is not None:
                continue  # not sent on this channel
            try:
                refusals = cache.refusals(channel, topic, user_ids, at_ms)
            except PreferencesUnavailable as exc:
                raise Unavailable(
                    "People's preferences could not be read; the what-if cannot be run."
                ) from exc
            reasons = Counter(refusal[0] for refusal in refusals or () if refusal is not None)
            rows.append(
                {
                    "channel": channel,
                    "topic": slug,
                    "required": topic is not None and topic.default == REQUIRED,
                    "preference": round(reasons[Reason.PREFERENCE] * scale),
                    "paused": round(reasons[Reason.PAUSED] * scale),
                }
            )
    return rows


def what_if_segment_audience(slug: str) -> tuple[np.ndarray, int]:
    """(ids to evaluate, audience size) for everyone in a segment of the live snapshot. A
    segment larger than WHAT_IF_LIMIT is sampled by position in its bitmap, so a huge segment
    is never copied out whole. Raises Unavailable saying why there is no audience."""
    index = get_index()
    if index is None:
        raise Unavailable("No segment snapshot is loaded, so no segment can be listed.")
    bitmap = index.bitmaps.get(slug)
    if bitmap is None:
        raise Unavailable(f"{slug} is not in the live snapshot (build first).")
    size = len(bitmap)
    if size <= WHAT_IF_LIMIT:
        return np.asarray(bitmap.to_array(), dtype=np.uint64), size
    positions = np.sort(np.random.default_rng().choice(size, WHAT_IF_LIMIT, replace=False))
    return np.array([bitmap[int(i)] for i in positions], dtype=np.uint64), size


def what_if_file_audience(upload: Any, name: str) -> np.ndarray:
    """The ids of an uploaded audience file (a user list: one id a line, text or gzip), within
    WHAT_IF_MAX_BYTES as sent, WHAT_IF_MAX_INFLATED decompressed and WHAT_IF_MAX_IDS ids.
    Raises Unavailable saying what is wrong with it."""
    larger = "Choose a segment for a larger audience."
    if upload.size > WHAT_IF_MAX_BYTES:
        raise Unavailable(
            f"{name}: {upload.size:,} bytes; a what-if list is at most {WHAT_IF_MAX_BYTES:,} "
            f"bytes. {larger}"
        )
    index = get_index()
    width = index.id_width if index is not None else 32
    parts, count = [], 0
    try:
        for part in iter_ids(upload, width=width, max_bytes=WHAT_IF_MAX_INFLATED):
            count += int(part.size)
            if count > WHAT_IF_MAX_IDS:
                raise Unavailable(f"{name}: more than {WHAT_IF_MAX_IDS:,} ids. {larger}")
            parts.append(part)
    except UserListError as exc:
        raise Unavailable(f"{name}: {exc.messages[0]}") from exc
    if not parts:
        raise Unavailable(f"{name} holds no user ids.")
    return np.concatenate(parts)


def _priority(index: SegmentIndex, slug: str) -> int:
    order = index.segments
    return order.index(slug) if slug in order else len(order)


def draft_table(changes: Mapping[tuple[str, str], tuple[int | None, int | None]]) -> PolicyTable:
    """The live rules with a draft of classic caps applied: (segment, scope) -> (daily, weekly)
    replaces that cap's two rules (None: no rule for that window)."""
    live = policy_read()
    rules: list[RuleView] = []
    replaced = {key for key in changes}
    for rule in live.rules:
        if rule.classic and (rule.segment or "", rule.channel) in replaced:
            continue
        rules.append(rule)
    drafted = -1
    for (segment, scope), limits in changes.items():
        for seconds, limit, which in zip(
            (DAY_SECONDS, WEEK_SECONDS), limits, ("daily", "weekly"), strict=True
        ):
            if limit is None:
                continue
            rule = counting_rule(
                channel=scope, seconds=seconds, limit=limit, name=f"{segment} {which} (draft)"
            )
            rules.append(replace(rule, id=drafted, segment=segment, classic=True))
            drafted -= 1
    classic = dict(live.classic)
    classic.update(changes)
    return PolicyTable(rules=tuple(rules), classic=classic, zones=live.zones, quiet=live.quiet)


def dashboard_stats(*, days: int = 14, today: Any = None) -> dict[str, Any]:
    """Decisions from the per-day Redis counters, shaped for the dashboard's tables and charts:
    today by segment x channel x reason, and admitted / refused per day for `days` days."""
    per_day = stats_for_days(days=days, today=today)
    last_day = max(per_day)
    today_counts = per_day[last_day]
    by_segment: dict[str, Counter[str]] = {}
    rows: dict[tuple[str, str], Counter[str]] = {}
    for (segment, channel, reason), count in today_counts.items():
        by_segment.setdefault(segment, Counter())[reason] += count
        rows.setdefault((segment, channel), Counter())[reason] += count
    reasons = [r for r in (*ADMITTED, *REFUSED) if any(c[r] for c in by_segment.values())]
    table = [
        {
            "segment": segment,
            "channel": channel,
            "admitted": sum(c[r] for r in ADMITTED),
            "refused": sum(c[r] for r in REFUSED),
            "reasons": {r: c[r] for r in reasons},
        }
        for (segment, channel), c in sorted(rows.items())
    ]
    history = {
        "days": [day.isoformat() for day in per_day],
        "admitted": [sum(n for k, n in c.items() if k[2] in ADMITTED) for c in per_day.values()],
        "refused": [sum(n for k, n in c.items() if k[2] in REFUSED) for c in per_day.values()],
    }
    return {
        "day": last_day.isoformat(),
        "reasons": reasons,
        "table": table,
        "today_by_segment": {
            "segments": sorted(by_segment),
            "datasets": {r: [by_segment[s][r] for s in sorted(by_segment)] for r in reasons},
        },
        "history": history,
        "admitted_today": sum(row["admitted"] for row in table),
        "refused_today": sum(row["refused"] for row in table),
    }


# --- quiet hours and waiting sends ------------------------------------------------------------


def _waiting() -> Any:
    return chunks_waiting()


def send_job_waiting(job_id: int) -> dict[str, Any]:
    """A job's waiting sends (deferred by the gate: caps, quiet hours): how many, and when the
    first and the last group of them is released (null when none waits). Each group's time is
    the latest release in it: nobody goes before their own, nobody a minute after."""
    found = (
        _waiting()
        .filter(job_id=job_id)
        .aggregate(sends=Sum("size"), next_at=Min("not_before"), last_at=Max("not_before"))
    )
    return {"sends": found["sends"] or 0, "next_at": found["next_at"], "last_at": found["last_at"]}


def waiting_by_hour(*, now: dt.datetime | None = None, hours: int = 48) -> dict[str, Any]:
    """Every job's waiting sends by the hour (UTC) they are released in, for the next `hours`
    hours from this one: `due` (released already: queued at beat's next tick), `hours` (one row
    per hour, zeros included), `later` and `total`."""
    now = instant_or_now(now)
    first = now.replace(minute=0, second=0, microsecond=0)
    end = first + dt.timedelta(hours=hours)
    per_hour = {
        row["hour"]: row["sends"]
        for row in _waiting()
        .filter(not_before__gt=now, not_before__lt=end)
        .annotate(hour=TruncHour("not_before", tzinfo=dt.UTC))
        .values("hour")
        .annotate(sends=Sum("size"))
    }
    totals = _waiting().aggregate(
        total=Sum("size"),
        due=Sum("size", filter=Q(not_before__lte=now)),
        later=Sum("size", filter=Q(not_before__gte=end)),
    )
    rows = []
    for i in range(hours):
        hour = first + dt.timedelta(hours=i)
        rows.append({"hour": hour, "sends": per_hour.get(hour, 0)})
    return {
        "due": totals["due"] or 0,
        "hours": rows,
        "later": totals["later"] or 0,
        "total": totals["total"] or 0,
    }


# --- the operator's figures (/metrics) ----------------------------------------------------------

CHUNK_STATES = ("due", "running", "waiting", "paused")


def chunks_backlog(*, now: dt.datetime | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    """Every queued chunk (not settled) by kind, then by state, with its recipients and, for
    the due ones, how long the oldest has been due: one grouped query, served by the index on
    (kind, status, not_before). The states, one per chunk:
    - `due`: may run now (worker.chunks' rule: no live run holds it, its release has come, its
      job is not paused); a worker takes it when one is free;
    - `running`: a live run holds its lease;
    - `waiting`: its release is ahead (a deferral, a retry's backoff);
    - `paused`: due, but its job is paused.
    A due chunk is due since its release (`not_before`), else since it was last handed to the
    broker (`queued_at`: beat hands a lost one out again after GATEKEEPER_CHUNK_REQUEUE_SECONDS,
    and its age counts from then), else since it was made. Returns
    {kind: {state: {"chunks", "sends"}}, plus "lag_seconds" under "due"}."""
    now = instant_or_now(now)
    free = chunks_free(now)
    due = Q(not_before__isnull=True) | Q(not_before__lte=now)
    states = {
        "due": chunks_runnable_at(now),
        "running": ~free,
        "waiting": free & Q(not_before__gt=now),
        "paused": free & due & Q(job__paused_at__isnull=False),
    }
    aggregates: dict[str, Any] = {}
    for state, where in states.items():
        aggregates[f"{state}_chunks"] = Count("pk", filter=where)
        aggregates[f"{state}_sends"] = Sum("size", filter=where)
    aggregates["due_since"] = Min(
        Coalesce("not_before", "queued_at", "created_at"), filter=states["due"]
    )
    rows = (
        SendChunk.objects.filter(kind__in=SendChunk.Kind.values, status=SendChunk.Status.QUEUED)
        .values("kind")
        .annotate(**aggregates)
    )
    found: dict[str, Any] = {row["kind"]: row for row in rows}
    backlog: dict[str, dict[str, dict[str, Any]]] = {}
    for kind in SendChunk.Kind.values:
        row: dict[str, Any] = found.get(kind, {})
        backlog[kind] = {
            state: {
                "chunks": row.get(f"{state}_chunks") or 0,
                "sends": row.get(f"{state}_sends") or 0,
            }
            for state in CHUNK_STATES
        }
        since = row.get("due_since")
        backlog[kind]["due"]["lag_seconds"] = (
            max(0.0, (now - since).total_seconds()) if since is not None else 0.0
        )
    return backlog


ACTIVE_JOBS = (
    SendJob.Status.PREPARING,
    SendJob.Status.SCHEDULED,
    SendJob.Status.QUEUED,
    SendJob.Status.RUNNING,
    SendJob.Status.PAUSED,
)


def jobs_by_status() -> dict[str, int]:
    """Send jobs not ended, by status (every status of ACTIVE_JOBS, 0 included)."""
    counted = dict(
        SendJob.objects.filter(status__in=ACTIVE_JOBS)
        .values_list("status")
        .annotate(n=Count("pk"))
        .values_list("status", "n")
    )
    return {status: counted.get(status, 0) for status in ACTIVE_JOBS}


def jobs_idle(*, now: dt.datetime | None = None) -> list[dict[str, Any]]:
    """The queued and running jobs (not paused) with chunks to run now, each with the seconds
    since its last sign of progress: a chunk of it settled (its counts saved, `updated_at`) or a
    run of it took or renewed a chunk's lease (a run renews it every third of
    GATEKEEPER_CHUNK_LEASE_SECONDS while it sends or waits for its provider's rate). A job that
    has only waiting sends is not listed: it waits by design."""
    now = instant_or_now(now)
    lease = dt.timedelta(seconds=float(settings.GATEKEEPER_CHUNK_LEASE_SECONDS))
    due = Q(not_before__isnull=True) | Q(not_before__lte=now)
    # From the queued chunks (the index on (kind, status, not_before)), not from the jobs: a
    # running job's settled chunks, all but a few of a large one's, are never read.
    jobs = (
        SendChunk.objects.filter(
            kind__in=SendChunk.Kind.values,
            status=SendChunk.Status.QUEUED,
            job__status__in=(SendJob.Status.QUEUED, SendJob.Status.RUNNING),
            job__paused_at__isnull=True,
        )
        .values("job_id", "job__channel", "job__campaign", "job__updated_at")
        .annotate(to_run=Count("pk", filter=due), leased=Max("lease_until"))
        .filter(to_run__gt=0)
    )
    idle = []
    for job in jobs:
        signs = [job["job__updated_at"]] + ([job["leased"] - lease] if job["leased"] else [])
        idle.append(
            {
                "job": job["job_id"],
                "channel": job["job__channel"],
                "campaign": job["job__campaign"],
                "idle_seconds": max(0.0, (now - max(signs)).total_seconds()),
            }
        )
    return sorted(idle, key=lambda j: j["job"])
