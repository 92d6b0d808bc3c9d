"""The web process follows newly published snapshots however it is run: `manage.py runserver`
(with its autoreloader) and gunicorn without the project's config file, as real processes."""

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from django.contrib.auth.models import Permission, User
from rest_framework.authtoken.models import Token

from bench.servers import free_port
from segments.models import Segment
from segments.publishing import build_run
from segments.services import build_start, user_list_import
from tests.support.celery_workers import ROOT, worker_env
from tests.support.worker_processes import TEST_BROKER_URL

pytestmark = [pytest.mark.processes, pytest.mark.slow, pytest.mark.django_db(transaction=True)]
BIN = Path(sys.executable).parent


def lookup(base: str, token: str) -> dict | None:
    try:
        response = requests.get(
            f"{base}/api/v1/segments/lookup/?user_id=1",
            headers={"Authorization": f"Token {token}"},
            timeout=15,
        )
    except (requests.ConnectionError, requests.Timeout):
        # Not up yet, or slow to answer on a loaded machine: asked again until the deadline.
        return None
    return response.json() if response.status_code == 200 else None


def wait_for_answer(base: str, token: str, version: str, seconds: float) -> dict:
    deadline = time.monotonic() + seconds
    answer = None
    while time.monotonic() < deadline:
        answer = lookup(base, token)
        if answer is not None and answer["snapshot_version"] == version:
            return answer
        time.sleep(0.2)
    raise AssertionError(f"still {answer} after {seconds} s, waiting for {version}")


@pytest.mark.parametrize(
    "command",
    [
        pytest.param([str(BIN / "python"), "manage.py", "runserver", "{bind}"], id="runserver"),
        pytest.param(
            [str(BIN / "gunicorn"), "gatekeeper.wsgi:application", "-b", "{bind}", "-w", "2"],
            id="gunicorn-without-config",
        ),
    ],
)
def test_a_web_process_picks_up_a_newly_published_snapshot(published, command):
    first = published(vip=(10, [1], {}))
    user = User.objects.create_user("reader")
    user.user_permissions.add(Permission.objects.get(codename="view_segment"))
    token = Token.objects.create(user=user).key
    bind = f"127.0.0.1:{free_port()}"
    env = worker_env(TEST_BROKER_URL, GATEKEEPER_SNAPSHOT_POLL_SECONDS="0.5")
    server = subprocess.Popen(
        [part.format(bind=bind) for part in command],
        cwd=ROOT,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        base = f"http://{bind}"
        assert wait_for_answer(base, token, first, 60)["segment"] == "vip"
        vip = Segment.objects.get(slug="vip")
        user_list_import(segment=vip, fileobj=io.BytesIO(b"2\n"), name="vip.txt", replace=True)
        second = build_run(build_id=build_start(queue=False).pk).version
        # Each of gunicorn's two workers answers from its own follower: ask several times.
        for _ in range(4):
            assert wait_for_answer(base, token, second, 30)["segment"] == "default"
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
