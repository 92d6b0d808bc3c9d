"""manage.py import_users <segment> <file> [--replace]: validate and store a user list."""

import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from gatekeeper.lib.words import count
from segments.models import Segment
from segments.parsing import UserListError
from segments.services import user_list_import


class _Progress:
    """A file wrapper that moves a progress bar as the import reads it."""

    def __init__(self, handle: Any, bar: Any) -> None:
        self.handle, self.bar = handle, bar

    def read(self, n: int = -1) -> bytes:
        data: bytes = self.handle.read(n)
        self.bar.update(len(data))
        return data


class Command(BaseCommand):
    help = "Validate a user-list file (one id a line, text or .gz) and add it to a segment."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("segment", help="the segment's slug")
        parser.add_argument("file", help="path of the list")
        parser.add_argument(
            "--replace", action="store_true", help="make it the segment's only list"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            segment = Segment.objects.get(slug=options["segment"])
        except Segment.DoesNotExist:
            slugs = ", ".join(Segment.objects.values_list("slug", flat=True))
            raise CommandError(f"No segment '{options['segment']}'. Segments: {slugs}.") from None
        path = options["file"]
        if not os.path.isfile(path):
            raise CommandError(f"No file at {path}.")
        with (
            open(path, "rb") as handle,
            tqdm(
                total=os.path.getsize(path),
                unit="B",
                unit_scale=True,
                desc="validating",
                disable=None,
            ) as bar,
        ):
            try:
                user_list = user_list_import(
                    segment=segment,
                    fileobj=_Progress(handle, bar),
                    name=os.path.basename(path),
                    replace=options["replace"],
                )
            except UserListError as exc:
                raise CommandError(f"{path}: {exc.messages[0]}. Nothing was stored.") from exc
        self.stdout.write(
            self.style.SUCCESS(
                f"Stored {count(user_list.id_count, 'user')} ({user_list.lines_explained}) "
                f"in segment '{segment.slug}'. Run `manage.py build_segments` to publish."
            )
        )
