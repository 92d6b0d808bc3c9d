"""The project's settings for the test process and the servers tests start, as `make run` has
them on a laptop: served over plain HTTP (test servers speak no TLS), so no HTTPS redirect and no
secure-only cookies, and the operator's probes answer callers on this machine."""

import os


def per_worker(variable: str, default: str) -> str:
    """A test setting that names a Redis database, for this process: `variable` (or `default`)
    is a comma-separated list, and the n-th process of a run spread over processes
    (pytest-xdist's worker gw<n>) takes the n-th, so that no two flush each other's data."""
    choices = [u.strip() for u in os.environ.get(variable, default).split(",") if u.strip()]
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    n = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    if n >= len(choices):
        raise RuntimeError(
            f"{variable} names {len(choices)} Redis database(s), and this run has a process "
            f"{worker}: give one more per process ({variable}=url1,url2,...)"
        )
    return choices[n]


os.environ.setdefault("DJANGO_HTTPS", "false")
os.environ.setdefault("GATEKEEPER_METRICS_NETWORKS", "127.0.0.0/8,::1/128")
# Tasks the tests queue go to a broker database of the tests' own, never to the one `make run`
# uses (database 0): a later `make run` must not find them. A broker a test gives a process it
# starts is kept; the one set here is set again in each process of a run spread over several
# (they inherit it from the process that started them).
if os.environ.get("CELERY_BROKER_URL") in (None, os.environ.get("GATEKEEPER_TEST_BROKER_SET")):
    os.environ["CELERY_BROKER_URL"] = os.environ["GATEKEEPER_TEST_BROKER_SET"] = per_worker(
        "GATEKEEPER_TEST_BROKER_URL",
        "redis://127.0.0.1:6379/9,redis://127.0.0.1:6379/10,redis://127.0.0.1:6379/8",
    )

from django.conf import global_settings  # noqa: E402

from gatekeeper.settings import *  # noqa: E402, F403

# Hashing a password the way production does (PBKDF2, a million rounds) takes 0.3 to 0.4 s of CPU,
# and the tests make and log in hundreds of users: the tests hash with a fast hasher first
# (Django's advice for test settings), the others kept so that any hash still verifies.
PASSWORD_HASHERS = [
    "django.contrib.auth.hashers.MD5PasswordHasher",
    *global_settings.PASSWORD_HASHERS,
]
