"""Large rows stored on PostgreSQL without Python's per-value escaping.

Django's `bulk_create` on PostgreSQL sends many rows as arrays (`INSERT ... SELECT * FROM
UNNEST(%s, ...)`), which psycopg dumps in Python, escaping every character of every JSON value
that needs it: for the chunks of a send job (hundreds of KB of JSON each) that was 12 us a
recipient, five times what PostgreSQL takes to store them. Stored one row per INSERT (in one
transaction), each value goes whole; with its parameters bound on the server (the extended
protocol, as Django's `server_side_binding` option does for every query) they are not quoted into
the SQL either: 2.0 us a recipient (docs/performance.md, "The front door").
"""

import contextlib
from collections.abc import Iterable, Iterator
from typing import TypeVar

from django.db import connection, models

M = TypeVar("M", bound=models.Model)


@contextlib.contextmanager
def server_binding() -> Iterator[None]:
    """The default connection's queries bind their parameters on the server meanwhile (on
    PostgreSQL; on other databases nothing changes)."""
    if connection.vendor != "postgresql":
        yield
        return
    from django.db.backends.postgresql.base import ServerBindingCursor

    connection.ensure_connection()
    raw = connection.connection
    before = raw.cursor_factory
    raw.cursor_factory = ServerBindingCursor
    try:
        yield
    finally:
        raw.cursor_factory = before


def large_rows_created(model: type[M], rows: Iterable[M]) -> list[M]:
    """`model.objects.bulk_create(rows)` (one transaction) for rows whose values are large."""
    with server_binding():
        return model._default_manager.bulk_create(rows, batch_size=1)
