"""Production settings from the environment, and what anonymous callers can see."""

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client, override_settings

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]


def check_deploy(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )


def test_check_deploy_is_clean_with_production_settings(tmp_path, own_redis):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "gatekeeper.settings",
        "DJANGO_DEBUG": "false",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "DJANGO_ALLOWED_HOSTS": "gatekeeper.example.com",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'deploy.sqlite3'}",
        # A Redis configured as docs/deploy.md asks (hash-max-listpack-value 4096).
        "REDIS_URL": own_redis.url,
        # A key rotated out, still trusted for the links of emails already sent.
        "DJANGO_SECRET_KEY_FALLBACKS": secrets.token_urlsafe(50),
    }
    env.pop("DJANGO_HTTPS", None)  # the production default: on
    done = check_deploy(env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues (0 silenced)." in done.stdout
    # A weak fallback is refused as a weak key is.
    weak_fallback = check_deploy(
        {**env, "DJANGO_SECRET_KEY_FALLBACKS": f"{secrets.token_urlsafe(50)},short"}
    )
    assert weak_fallback.returncode != 0
    assert "security.W025" in weak_fallback.stdout + weak_fallback.stderr
    # The development key is refused as a production secret.
    env.pop("DJANGO_SECRET_KEY")
    weak = check_deploy(env)
    assert weak.returncode != 0 and "security.W009" in weak.stdout + weak.stderr


@override_settings(SECURE_SSL_REDIRECT=True)
def test_https_redirects_pages_but_not_the_probes_load_balancers_call():
    client = Client()
    assert client.get("/admin/").status_code == 301
    assert client.get("/healthz").status_code == 200


@pytest.mark.django_db
def test_anonymous_callers_see_a_bare_status_and_operators_the_details(settings, redis_client):
    settings.GATEKEEPER_METRICS_NETWORKS = []
    settings.GATEKEEPER_METRICS_TOKEN = "s3cret-token"
    client = Client()
    ready = client.get("/readyz")
    assert ready.status_code == 503 and ready.json() == {"ready": False}
    metrics = client.get("/metrics")
    assert metrics.status_code == 403 and b"GATEKEEPER_METRICS_TOKEN" in metrics.content
    assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 403
    operator = {"Authorization": "Bearer s3cret-token"}
    assert "checks" in client.get("/readyz", headers=operator).json()
    assert client.get("/metrics", headers=operator).status_code == 200
    # From an allowed network, no token is needed (Django's test client calls from 127.0.0.1).
    settings.GATEKEEPER_METRICS_NETWORKS = ["127.0.0.0/8"]
    assert client.get("/metrics").status_code == 200
    assert "snapshot" in client.get("/readyz").json()["checks"]
