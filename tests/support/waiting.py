"""The waiting sends' scenario: quiet_vip's users in Paris, a night and a morning, each user's release, and a job's counts adding up."""

from datetime import UTC, datetime, time, timedelta
from zoneinfo import ZoneInfo

from django.utils import timezone

from gatekeeper.lib.instants import instant_from_ms, instant_ms
from limits.engine.quiet import release_at
from tests.support.published import QUIET_USERS
from worker.models import SendJob

PARIS = ZoneInfo("Europe/Paris")


USERS = QUIET_USERS  # quiet_vip's (tests/worker/conftest.py)


SPREAD = 30 * 60


def paris(days: int, hour: int, minute: int = 0) -> datetime:
    """A wall-clock time in Paris, `days` after today's date there (always in the future, so
    that a job's expiry around it is valid), as a UTC instant."""
    day = timezone.now().astimezone(PARIS).date() + timedelta(days=days)
    return datetime.combine(day, time(hour, minute), PARIS).astimezone(UTC)


NIGHT = paris(2, 23)


MORNING = paris(3, 8)


def release(user_id: int) -> datetime:
    """When quiet hours ending at MORNING let this user's send go (their place in the spread)."""
    return instant_from_ms(release_at(instant_ms(MORNING), SPREAD, user_id))


def adds_up(job: SendJob) -> dict[str, int]:
    job.refresh_from_db()
    counts = {outcome: getattr(job, outcome) for outcome in (*SendJob.OUTCOMES, "pending")}
    assert sum(counts.values()) == job.total, counts
    return counts
