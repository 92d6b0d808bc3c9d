"""The project's settings for the test process and the servers tests start: served over plain
HTTP (test servers speak no TLS), so no HTTPS redirect and no secure-only cookies."""

import os

os.environ.setdefault("DJANGO_HTTPS", "false")

from gatekeeper.settings import *  # noqa: F403
