"""Logs as JSON: `GATEKEEPER_LOG_FORMAT=json` (gatekeeper/settings.py) writes one JSON object a
line, for a log shipper. `json_formatter` is the one formatter Django's logging and Celery's
worker and beat (worker/celery_hooks.py) all use."""

import logging

from pythonjsonlogger.json import JsonFormatter


def json_formatter() -> logging.Formatter:
    """One JSON object a line: `time` (ISO 8601, UTC), `level`, `logger`, `message`, and the
    record's extras and `exc_info` (the traceback) when it has them."""
    return JsonFormatter(
        "%(levelname)s %(name)s %(message)s",
        rename_fields={"levelname": "level", "name": "logger"},
        timestamp="time",
    )
