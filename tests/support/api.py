"""The REST API in tests: a live server, a token session per role as deployments have them
(Viewer, Marketer, a campaign system), a published demo snapshot, and gate bodies."""

import io
from collections.abc import Callable
from datetime import datetime, time
from zoneinfo import ZoneInfo

import pytest
import requests
from django.contrib.auth.models import Group, Permission, User
from rest_framework.authtoken.models import Token

from gatekeeper.lib.groups import MARKETER, VIEWER
from gatekeeper.lib.permissions import CAMPAIGN_SYSTEM
from limits.policy.services import cap_set
from segments.models import Segment
from segments.publishing import build_run
from segments.services import build_start, user_list_import


def make_user(name: str, *perms: str, group: str | None = None) -> User:
    user = User.objects.create_user(name, password="pw")
    for perm in perms:
        app, codename = perm.split(".")
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app, codename=codename)
        )
    if group is not None:
        user.groups.add(Group.objects.get(name=group))
    return user


def token_session(base_url: str, user: User | None) -> requests.Session:
    s = requests.Session()
    s.base_url = base_url  # type: ignore[attr-defined]
    if user is not None:
        token, _ = Token.objects.get_or_create(user=user)
        s.headers["Authorization"] = f"Token {token.key}"
    return s


@pytest.fixture
def api(live_server, transactional_db, redis_client) -> Callable[..., requests.Session]:
    """api("viewer") -> a requests session with that user's token, against the live server.

    Roles as deployments have them: the Viewer and Marketer groups, and a campaign system's
    account ("gate")."""
    roles: dict[str, tuple[tuple[str, ...], str | None] | None] = {
        "anonymous": None,
        "nobody": ((), None),
        "viewer": ((), VIEWER),
        "gate": (CAMPAIGN_SYSTEM, None),
        "marketer": ((), MARKETER),
    }

    def session(role: str) -> requests.Session:
        spec = roles[role]
        if spec is None:
            return token_session(live_server.url, None)
        perms, group = spec
        user = User.objects.filter(username=role).first() or make_user(role, *perms, group=group)
        return token_session(live_server.url, user)

    return session


def call(session: requests.Session, method: str, path: str, **kwargs) -> requests.Response:
    return session.request(method, session.base_url + path, timeout=30, **kwargs)  # type: ignore[attr-defined]


@pytest.fixture
def snapshot(transactional_db) -> str:
    vip = Segment.objects.create(slug="vip", name="VIP", priority=10)
    user_list_import(segment=vip, fileobj=io.BytesIO(b"1\n2\n"), name="vip.txt")
    cap_set(segment=vip, channel="email", daily=2, weekly=3, via="command")
    cap_set(segment=vip, channel="all", daily=3, weekly=None, via="command")
    # Flushes between live-server tests remove the migration's default segment: make it again.
    default, _ = Segment.objects.get_or_create(
        is_default=True,
        defaults={"slug": "default", "name": "Everyone else", "priority": 1_000_000},
    )
    cap_set(segment=default, channel="email", daily=1, weekly=1, via="command")
    return build_run(build_id=build_start(queue=False).pk).version


def check_body(requests_, **extra):
    return {
        "channel": "email",
        "requests": [{"user_id": u, "message_id": m} for u, m in requests_],
        **extra,
    }


def zones_a_day_apart(now: float) -> tuple[str, str, float]:
    """(earlier, later, at): two zones and a recent time that is today in `earlier` and
    yesterday in `later`, whatever the hour `now` is: just before `later`'s midnight, when
    `earlier`'s day had begun hours before. None of these zones shifts its clock near midnight."""
    zones = ["Pacific/Kiritimati", "Asia/Kathmandu", "Europe/Berlin", "Pacific/Pago_Pago"]
    starts = {}
    for name in zones:
        local = datetime.fromtimestamp(now, tz=ZoneInfo(name))
        starts[name] = datetime.combine(local.date(), time(), local.tzinfo).timestamp()
    # Ten minutes of margin on each side: the limiter reads periods a minute behind its clock.
    later = max((z for z in zones if starts[z] < now - 600), key=starts.__getitem__)
    earlier = min(zones, key=starts.__getitem__)
    at = starts[later] - 600
    assert starts[earlier] < at < now
    return earlier, later, at
