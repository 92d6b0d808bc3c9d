"""gunicorn settings for the web process (`make run`, Procfile).

Stopping (SIGTERM to the master, as systemd's KillMode=mixed and Kubernetes send it; docs/deploy.md,
"Stopping a process politely"): every request already sent is answered whole, and a connection
made afterwards is refused at connect, not reset once its request is sent. gunicorn alone does not
quite do that: on SIGTERM its workers stop taking connections but keep the listening socket open
(the kernel still completes new connections into its queue) until the last of them exits, and the
connections left in that queue, requests and all, are then reset. So the workers are
`PoliteThreadWorker`s: when the server stops, a worker first takes every connection waiting in
the queue (answered with the rest, within `graceful_timeout`), then stops the socket listening.
Only when the server stops: a worker stopped alone (a reload's, a timeout's) must leave the
socket, which the others go on serving, as it is.

The app is preloaded in the master so the segment snapshot is loaded once and its bitmaps
(numpy buffers that Python's reference counting never touches) stay shared copy-on-write by every
worker. Threads do not survive fork, so each worker starts its own snapshot follower and opens
its own Redis connections.
"""

import contextlib
import errno
import gc
import mmap
import os
import select
import socket

from gunicorn.workers.gthread import ThreadWorker

bind = os.environ.get("GATEKEEPER_BIND", "127.0.0.1:8000")
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
threads = int(os.environ.get("WEB_THREADS", "4"))
# gunicorn's gthread worker (threads, kept-alive connections; since gunicorn 27 a stopping one
# answers the connections it has taken), with the stop of PoliteThreadWorker below.
worker_class = "gatekeeper.gunicorn_conf.PoliteThreadWorker"
preload_app = True
accesslog = os.environ.get("GUNICORN_ACCESSLOG", "-") or None
timeout = 60
# How long a stopping worker may take to answer what it has taken (gunicorn's default, written
# down): the slowest request, a campaign file upload of hundreds of MB on a slow link, is what it
# must cover. systemd's TimeoutStopSec for the web unit (45 s) is above it.
graceful_timeout = 30
# gunicorn's default: an idle kept-alive connection is closed after 2 s (a stopping worker's too;
# a request arriving on it meanwhile is answered with `Connection: close`).
keepalive = 2


class PoliteThreadWorker(ThreadWorker):
    """gunicorn's gthread worker, that once told to stop takes the connections waiting in the
    listening socket's queue before it stops the socket listening: they are answered, and a
    connection made after that is refused at connect instead of being reset when the last
    worker exits. (One made in the microseconds between the two can still be reset.)"""

    # The master's mark that the whole server stops (`when_ready` makes it, `post_fork` hands it
    # to the worker): a byte of memory shared by the master and the workers it forks.
    server_stopping: mmap.mmap | None = None

    def _server_stops(self) -> bool:
        return self.server_stopping is not None and self.server_stopping[0] == 1

    def accept(self, listener: socket.socket) -> None:
        try:
            super().accept(listener)
        except OSError as error:
            if error.errno != errno.EINVAL or not self._server_stops():
                raise
            # Another worker stopped the socket listening before this one heard its SIGTERM
            # (on its way from the master): it stops now, as it would in a moment.
            self.alive = False

    def set_accept_enabled(self, enabled: bool) -> None:
        # Called with False once the worker's loop ended: it stops.
        stopping = not enabled and not self.alive and self._server_stops()
        if stopping:
            taken = sum(self._take_waiting(listener) for listener in self.sockets)
        super().set_accept_enabled(enabled)
        if stopping:
            for listener in self.sockets:
                # The socket is the master's and every worker's: the first to stop ends its
                # listening for all (later connects are refused); for the others it fails.
                with contextlib.suppress(OSError):
                    listener.shutdown(socket.SHUT_RD)
            self.log.info("Stopping: took %d waiting connections; no longer listening", taken)

    def _take_waiting(self, listener: socket.socket) -> int:
        before = self.nr_conns
        for _ in range(self.worker_connections):
            if not select.select([listener], [], [], 0)[0]:
                break
            try:
                # gunicorn's accept: nothing when another worker took it first.
                super().accept(listener)
            except OSError:
                break  # the socket no longer listens: another worker stopped it
        return self.nr_conns - before


# The hooks import the project when they run: gunicorn reads this file before the Django app
# (and its registry) is loaded.


def when_ready(server):
    from worker.startup import load_snapshot

    load_snapshot(role="web")
    _mark_stops(server)
    # As the Celery worker's parent does (worker/celery_hooks.py): what the master made before
    # forking (Django, every app's modules, the snapshot) is never collected, so it stays out of
    # the collector's walks and its pages stay shared with the workers instead of copied.
    gc.freeze()


def post_fork(server, worker):
    from worker.startup import after_fork

    after_fork(role="web")
    worker.server_stopping = getattr(server, "gatekeeper_stopping", None)


def _mark_stops(server):
    """SIGTERM to the master marks, before the master tells its workers, that the server stops
    (see PoliteThreadWorker). Not when the socket outlives this master: an upgrade's new master
    (USR2) shares it, or systemd's socket unit holds it (gunicorn leaves such a socket as it is)."""
    mark = mmap.mmap(-1, 1)  # anonymous and shared: the workers forked from now on see it
    term = server.handle_term

    def handle_term():
        if server.reexec_pid == server.master_pid == 0 and not server.systemd:
            mark[0] = 1
        term()

    server.handle_term = handle_term
    server.gatekeeper_stopping = mark
