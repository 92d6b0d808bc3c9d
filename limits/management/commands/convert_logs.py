"""manage.py convert_logs [--dry-run] [--restart] [--max-keys N]: move every send log of the
earlier format (two sorted sets per user and channel) into the new log. docs/limiter.md,
"Upgrading from the two-sorted-set logs", has the procedure."""

from typing import Any

import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from gatekeeper.lib.words import count
from limits.engine.limiter import get_limiter
from limits.engine.upkeep import PAGE, logs_convert, logs_convert_restart, logs_convert_unfinished
from limits.policy.selectors import policy_read


class Command(BaseCommand):
    help = (
        "Move the send logs of the earlier format into the new log, on every Redis primary. "
        "Resumable: a run that stops is continued by the next one. Safe to run while the "
        "gate decides with GATEKEEPER_LOG_UPGRADE on; run it until it reports none left."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--dry-run", action="store_true", help="count what would be moved; change nothing"
        )
        parser.add_argument(
            "--restart",
            action="store_true",
            help="forget where an unfinished run stopped and start at the beginning",
        )
        parser.add_argument(
            "--max-keys",
            type=int,
            default=None,
            help="stop after about this many old logs (the next run continues from there)",
        )
        parser.add_argument(
            "--scan-count", type=int, default=PAGE, help="keys each SCAN call looks at"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        dry_run = options["dry_run"]
        max_keys = options["max_keys"]
        if max_keys is not None and max_keys < 1:
            raise CommandError("--max-keys must be at least 1.")
        if options["scan_count"] < 1:
            raise CommandError("--scan-count must be at least 1.")
        limiter = get_limiter()
        if not dry_run and not settings.GATEKEEPER_LOG_UPGRADE:
            self.stderr.write(
                self.style.WARNING(
                    "GATEKEEPER_LOG_UPGRADE is off: until this run has moved a user's old logs, "
                    "the gate's decisions do not count the sends they hold."
                )
            )
        try:
            if options["restart"] and not dry_run:
                logs_convert_restart(limiter)
            resumed = not dry_run and logs_convert_unfinished(limiter)
            if resumed:
                self.stdout.write("Continuing the pass an earlier run stopped in.")
            keys = users = entries = ignored = 0
            nodes: set[str] = set()
            stopped = False
            pages = logs_convert(
                limiter,
                retention_ms=policy_read().retention_ms,
                page=options["scan_count"],
                dry_run=dry_run,
            )
            with tqdm(unit=" logs", desc="converting", disable=None) as bar:
                for page in pages:
                    nodes.add(page.node)
                    keys += page.keys
                    users += page.users
                    entries += page.entries
                    ignored += page.ignored
                    bar.update(page.keys)
                    bar.set_postfix(users=users, entries=entries)
                    if max_keys is not None and keys >= max_keys and not page.finished:
                        stopped = True
                        break
                pages.close()
        except (redis.RedisError, OSError, KeyboardInterrupt) as exc:
            raise CommandError(
                f"Stopped ({type(exc).__name__}: {exc}). What was moved stays moved; run it "
                "again to continue where it stopped."
            ) from exc

        found = count(keys, "old log")
        if dry_run:
            self.stdout.write(
                f"Dry run: {found} of {count(users, 'user')} holding "
                f"{count(entries, 'entry', 'entries')} to move. Nothing was changed."
            )
        else:
            self.stdout.write(
                f"Found {found} on {count(len(nodes), 'node')}: moved {count(users, 'user')}, "
                f"added {count(entries, 'entry', 'entries')} to the new logs."
            )
        if ignored:
            self.stdout.write(f"Left alone {count(ignored, 'key')} named like old logs.")
        if stopped and dry_run:
            self.stdout.write("Stopped at --max-keys.")
        elif stopped:
            self.stdout.write("Stopped at --max-keys: run it again to continue from there.")
        elif not dry_run and keys == 0 and not resumed:
            self.stdout.write(self.style.SUCCESS("No logs of the earlier format are left."))
        elif not dry_run:
            self.stdout.write("Pass complete: run it again until it reports none are left.")
