"""manage.py group_logs [--force]: move every user's logs still in its bucket into its group of
16, on every Redis primary; then every limiter reads buckets no more. docs/deploy.md ("Deploying
a release", step 4) says when; docs/limiter.md ("Buckets and groups") what it does."""

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from gatekeeper.lib.redis_client import REDIS_DOWN
from gatekeeper.lib.words import count
from limits.engine.limiter import get_limiter
from limits.engine.log import grouped_key
from limits.engine.upkeep import PAGE, logs_group
from limits.policy.selectors import policy_read
from worker.processes import other_releases_refusal


class Command(BaseCommand):
    help = (
        "Move every user's send logs still in its bucket of 256 into its group of 16, on every "
        "Redis primary; once done, the limiters read buckets no more. Refused while a process "
        "of another release runs. Safe to run again: it moves what is left."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--force",
            action="store_true",
            help="move them even so (a process of the release before may still write a new "
            "user's logs into its bucket, where this release would no longer look)",
        )
        parser.add_argument(
            "--scan-count", type=int, default=PAGE, help="keys each SCAN call looks at"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["scan_count"] < 1:
            raise CommandError("--scan-count must be at least 1.")
        limiter = get_limiter()
        try:
            refusal = other_releases_refusal(
                "Not moved",
                "a process of the release before may write a new user's logs into its bucket, "
                "which this release no longer reads",
            )
            if refusal and not options["force"]:
                raise CommandError(refusal)
            if limiter.client.exists(grouped_key(limiter.prefix)):
                self.stdout.write("The logs were moved into their groups already; looking again.")
            retention_ms = policy_read().retention_ms
            buckets = moved = 0
            with tqdm(unit=" buckets", desc="moving", disable=None) as bar:
                for page in logs_group(
                    limiter, retention_ms=retention_ms, page=options["scan_count"]
                ):
                    buckets += page.buckets
                    moved += page.moved
                    bar.update(page.buckets)
        except REDIS_DOWN as exc:
            raise CommandError(
                f"Redis failed ({type(exc).__name__}: {exc}). What was moved stays moved; "
                "run it again."
            ) from exc
        self.stdout.write(
            self.style.SUCCESS(
                f"Moved {count(moved, 'log')} out of {count(buckets, 'bucket')} into their groups"
                f" (prefix {settings.GATEKEEPER_KEY_PREFIX!r}). Every limiter reads buckets no "
                f"more within a minute."
            )
        )
