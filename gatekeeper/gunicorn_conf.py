"""gunicorn settings for the web process (`make run`, Procfile).

The app is preloaded in the master so the segment snapshot is loaded once and its bitmaps
(numpy buffers that Python's reference counting never touches) stay shared copy-on-write by every
worker. Threads do not survive fork, so each worker starts its own snapshot follower and opens
its own Redis connections.
"""

import gc
import os

bind = os.environ.get("GATEKEEPER_BIND", "127.0.0.1:8000")
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
threads = int(os.environ.get("WEB_THREADS", "4"))
worker_class = "gthread"
preload_app = True
accesslog = os.environ.get("GUNICORN_ACCESSLOG", "-") or None
timeout = 60


# The hooks import the project when they run: gunicorn reads this file before the Django app
# (and its registry) is loaded.


def when_ready(server):
    from worker.startup import load_snapshot

    load_snapshot(role="web")
    # As the Celery worker's parent does (worker/celery_hooks.py): what the master made before
    # forking (Django, every app's modules, the snapshot) is never collected, so it stays out of
    # the collector's walks and its pages stay shared with the workers instead of copied.
    gc.freeze()


def post_fork(server, worker):
    from worker.startup import after_fork

    after_fork(role="web")
