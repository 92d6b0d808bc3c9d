"""manage.py rebuild_logs [--restart] [--batch N]: after Redis lost its data, put every send the
send ledger holds that a log would still count back into the users' logs. docs/ledger.md,
"Rebuilding the logs", has the procedure."""

from typing import Any

import redis
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError
from tqdm import tqdm

from gatekeeper.lib.words import count
from limits.ledger.rebuild import Rebuilt, logs_rebuild


class Command(BaseCommand):
    help = (
        "Refill the users' send logs in Redis from the send ledger (the sends still inside the "
        "longest window), on every Redis primary. Resumable: a run that stops is continued by "
        "the next one. Safe to run twice: a send already in its log is not added again."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--restart",
            action="store_true",
            help="forget where an unfinished run stopped and start at the first user",
        )
        parser.add_argument(
            "--batch", type=int, default=20_000, help="sends read from the ledger at a time"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["batch"] < 1:
            raise CommandError("--batch must be at least 1.")
        with tqdm(unit=" users", desc="rebuilding", disable=None) as bar:
            done = [0]

            def progress(report: Rebuilt) -> None:
                bar.update(report.users - done[0])
                done[0] = report.users
                bar.set_postfix(sends=report.sends, added=report.added, last=report.last_user)

            try:
                report = logs_rebuild(
                    batch=options["batch"], restart=options["restart"], progress=progress
                )
            except (redis.RedisError, OSError, DatabaseError, KeyboardInterrupt) as exc:
                raise CommandError(
                    f"Stopped ({type(exc).__name__}: {exc}). What was put back stays; run it "
                    "again to continue after the last user done."
                ) from exc
        if report.resumed_after is not None:
            self.stdout.write(f"Continued after user {report.resumed_after}.")
        self.stdout.write(
            self.style.SUCCESS(
                f"Rebuilt the logs of {count(report.users, 'user')} from "
                f"{count(report.sends, 'send')} in the ledger: added "
                f"{count(report.added, 'send')} the logs did not hold, "
                f"in {report.seconds:.1f} s."
            )
        )
