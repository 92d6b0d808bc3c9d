"""manage.py build_segments [--wait]: build and publish a snapshot of every segment."""

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from segments.models import Build
from segments.publishing import BuildBusy, BuildInProgress, build_run
from segments.services import build_start


class Command(BaseCommand):
    help = "Build the segment bitmaps and publish them as a new live snapshot."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--wait",
            action="store_true",
            help="build here and now with a progress bar, instead of queueing it for a worker",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["wait"]:
            try:
                build = build_start()
            except BuildInProgress as exc:
                raise CommandError(str(exc)) from exc
            self.stdout.write(f"Build #{build.pk} queued; a worker on the `builds` queue runs it.")
            return
        try:
            build = build_start(queue=False)
        except BuildInProgress as exc:
            raise CommandError(str(exc)) from exc
        with tqdm(total=100, unit="%", desc="building", disable=None) as bar:

            def show(current: Build) -> None:
                bar.set_postfix_str(current.stage[:40])
                bar.update(current.progress - bar.n)

            try:
                build = build_run(build_id=build.pk, on_progress=show)
            except BuildBusy as exc:
                raise CommandError(
                    "Another build is publishing right now; try again shortly."
                ) from exc
            except Exception as exc:
                raise CommandError(f"Build #{build.pk} failed: {exc}") from exc
        self.stdout.write(
            self.style.SUCCESS(
                f"Published snapshot {build.version}: {build.total_users:,} users in lists, "
                f"{build.snapshot_bytes:,} bytes."
            )
        )
        for slug, figures in build.stats.items():
            if figures.get("cardinality") is None:
                continue
            self.stdout.write(
                f"  {slug:<20} {figures['cardinality']:>12,} users"
                f"  ({figures['lost_to_higher_priority']:,} in higher-priority segments)"
            )
