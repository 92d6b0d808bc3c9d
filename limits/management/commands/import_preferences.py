"""manage.py import_preferences FILE [--format csv|jsonl] [--by USERNAME] [--every N]: import a
file of people's preferences from disk, as `PUT /api/v1/preferences/import/` does an upload
(limits/people/preferences_import.py; docs/api.md, "Importing people's preferences")."""

import time
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from gatekeeper.lib.accounts import account_named
from gatekeeper.lib.words import count
from limits.people.preferences_import import (
    FORMATS,
    MAX_UPLOAD_BYTES,
    PreferencesFileRefused,
    PreferencesFileTooLarge,
    import_format,
    preferences_import,
)


class Command(BaseCommand):
    help = (
        "Import a file of people's preferences (CSV or JSON lines, text or gzip): each person "
        "in it gets the file's preferences, whole. All or nothing: the file is checked first, "
        "and any bad line refuses it, naming the line. Written a thousand people a "
        "transaction; run again after a crash, the same file changes only what is left."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", type=Path, help="the file (.csv, .jsonl, .ndjson; or .gz)")
        parser.add_argument(
            "--format", choices=FORMATS, help="the file's format (default: told by its name)"
        )
        parser.add_argument("--by", help="the user the changes are journaled as made by")
        parser.add_argument(
            "--every", type=int, default=100_000, help="print progress every N lines or people"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        path: Path = options["file"]
        if options["every"] < 1:
            raise CommandError("--every must be at least 1.")
        by = account_named(options["by"])
        try:
            file_format = import_format(given=options["format"], name=path.name)
        except PreferencesFileRefused as exc:
            raise CommandError(str(exc)) from None
        every = options["every"]
        shown: dict[str, int] = {}

        def progress(stage: str, done: int) -> None:
            if done // every > shown.get(stage, 0):
                shown[stage] = done // every
                what = "line" if stage == "checked" else "person"
                plural = "lines" if stage == "checked" else "people"
                self.stdout.write(f"{stage.capitalize()} {count(done, what, plural)}.")

        started = time.monotonic()
        try:
            with path.open("rb") as file:
                imported = preferences_import(
                    fileobj=file, file_format=file_format, by=by, progress=progress
                )
        except OSError as exc:
            raise CommandError(f"{path}: {exc.strerror or exc}") from None
        except PreferencesFileTooLarge:
            raise CommandError(
                f"{path} is larger than {MAX_UPLOAD_BYTES:,} bytes, the most a file of "
                "preferences may be. Nothing was written."
            ) from None
        except PreferencesFileRefused as exc:
            raise CommandError(
                "Refused, nothing written:\n" + "\n".join(f"  {m}" for m in exc.messages)
            ) from None
        except (DatabaseError, KeyboardInterrupt) as exc:
            raise CommandError(
                f"Stopped ({type(exc).__name__}: {exc}). The batches written before stay; "
                "import the same file again to write the rest."
            ) from exc
        seconds = time.monotonic() - started
        rate = imported.people / max(imported.writing_seconds, 1e-3)
        self.stdout.write(
            self.style.SUCCESS(
                f"Imported {count(imported.people, 'person', 'people')} from "
                f"{count(imported.lines, 'line')}: {imported.changed:,} changed, "
                f"{imported.unchanged:,} unchanged, in {seconds:.1f} s (checked in "
                f"{imported.checking_seconds:.1f} s, written in {imported.writing_seconds:.1f} s: "
                f"{rate:,.0f} people a second)."
            )
        )
