"""The project's settings for the test process and the servers tests start, as `make run` has
them on a laptop: served over plain HTTP (test servers speak no TLS), so no HTTPS redirect and no
secure-only cookies, and the operator's probes answer callers on this machine."""

import os

os.environ.setdefault("DJANGO_HTTPS", "false")
os.environ.setdefault("GATEKEEPER_METRICS_NETWORKS", "127.0.0.0/8,::1/128")
# Tasks the tests queue go to a broker database of the tests' own, never to the one `make run`
# uses (database 0): a later `make run` must not find them.
os.environ.setdefault(
    "CELERY_BROKER_URL",
    os.environ.get("GATEKEEPER_TEST_BROKER_URL", "redis://127.0.0.1:6379/9"),
)

from gatekeeper.settings import *  # noqa: F403
