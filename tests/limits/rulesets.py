"""Rules and rule sets for limiter tests, without the database."""

from limits.engine.table import RuleSet, RuleView, encode

DAY_S, WEEK_S = 86_400, 604_800


def rule(
    rule_id: int,
    *,
    limit: int,
    channel: str = "email",
    seconds: int | None = None,
    unit: str = "",
    match: str = "any",
    tag: str = "",
    reserve: tuple[int, int] | None = None,
    segment: str | None = None,
    classic: bool = False,
) -> RuleView:
    return RuleView(
        id=rule_id,
        name=f"rule {rule_id}",
        segment=segment,
        channel=channel,
        match=match,
        tag=tag,
        window_kind="calendar" if unit else "rolling",
        window_seconds=None if unit else seconds,
        window_unit=unit,
        limit=limit,
        reserve_below_priority=reserve[0] if reserve else None,
        reserve_slots=reserve[1] if reserve else None,
        classic=classic,
    )


def rule_set(*rules: RuleView, now_ms: int = 0, zone: str = "UTC", priority: int = 5) -> RuleSet:
    return encode(list(rules), priority=priority, zone=zone, now_ms=now_ms)


def caps(
    daily: int | None = None,
    weekly: int | None = None,
    all_daily: int | None = None,
    all_weekly: int | None = None,
    channel: str = "email",
) -> RuleSet:
    """The classic caps as rules: ids 1, 2 (the channel's daily, weekly), 3, 4 (all's)."""
    found = []
    for rule_id, scope, seconds, limit in (
        (1, channel, DAY_S, daily),
        (2, channel, WEEK_S, weekly),
        (3, "all", DAY_S, all_daily),
        (4, "all", WEEK_S, all_weekly),
    ):
        if limit is not None:
            found.append(rule(rule_id, limit=limit, channel=scope, seconds=seconds, classic=True))
    encoded = rule_set(*found)
    return RuleSet(
        records=encoded.records,
        rules=encoded.rules,
        effective=encoded.effective,
        limits={"daily": daily, "weekly": weekly},
    )


def ms(seconds: float) -> int:
    """A test's clock (epoch seconds, as `retry_after` reads) as the engine takes it: epoch
    milliseconds."""
    return round(seconds * 1000)
