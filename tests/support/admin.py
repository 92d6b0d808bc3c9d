"""Staff users of the admin: a Marketer and a Viewer logged in through Django's test client."""

from collections.abc import Callable

import pytest
from django.contrib.auth.models import Group

from gatekeeper.lib.groups import MARKETER, VIEWER, groups_sync

PASSWORD = "a-long-test-password"


@pytest.fixture
def staff(django_user_model) -> Callable[..., object]:
    """staff("ann", "Marketer") -> a logged-in-able staff user in that group (or none)."""

    def make(username: str, group: str | None = None) -> object:
        groups_sync()  # transactional tests flush the groups the migration made
        user = django_user_model.objects.create_user(username, password=PASSWORD, is_staff=True)
        if group:
            user.groups.add(Group.objects.get(name=group))
        return user

    return make


@pytest.fixture
def marketer_client(client, staff):
    staff("mia", MARKETER)
    client.login(username="mia", password=PASSWORD)
    return client


@pytest.fixture
def viewer_client(client, staff):
    staff("vic", VIEWER)
    client.login(username="vic", password=PASSWORD)
    return client
