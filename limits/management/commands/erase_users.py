"""manage.py erase_users FILE [--by USERNAME]: erase the people of a file of user ids everywhere
(GDPR article 17), as `POST /api/v1/users/erase/` does up to 1,000 at a time
(limits/privacy/erasure.py; docs/api.md, "Erasing people")."""

import time
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from gatekeeper.lib.accounts import account_named
from gatekeeper.lib.words import count
from limits.models.privacy import Erasure
from limits.people.suppression import ids_file_read
from limits.policy.quota import Unavailable
from limits.privacy.erasure import erasure_progress, erasure_run
from limits.privacy.services import erasure_start
from segments.parsing import UserListError


class Command(BaseCommand):
    help = (
        "Erase the people of a file of user ids (one a line, as a user list: text or gzip) "
        "everywhere, both passes, printing each. Run again with the same file after a crash: "
        "nothing more is removed of those already erased."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", type=Path, help="the file of user ids")
        parser.add_argument("--by", help="the account the erasure is recorded as asked by")

    def handle(self, *args: Any, **options: Any) -> None:
        path: Path = options["file"]
        by = account_named(options["by"])
        try:
            with path.open("rb") as fileobj:
                ids = ids_file_read(fileobj)
        except OSError as exc:
            raise CommandError(f"{path}: {exc.strerror or exc}") from None
        except UserListError as exc:
            raise CommandError(f"{path}: {exc}") from None
        if not ids:
            raise CommandError(f"{path} holds no user id.")
        erasure = erasure_start(user_ids=ids, via="command", by=by)
        self.stdout.write(f"Erasure {erasure.pk}: {count(len(ids), 'person', 'people')}.")
        while erasure.status != Erasure.Status.DONE:
            wait = (erasure.next_at - timezone.now()).total_seconds() if erasure.next_at else 0
            if wait > 0:
                self.stdout.write(f"  next pass in {wait:.0f} s")
                time.sleep(wait)
            try:
                ran = erasure_run(erasure.pk)
            except Unavailable as exc:
                raise CommandError(f"{exc} Erasure {erasure.pk} goes on once it answers.") from None
            erasure = ran or Erasure.objects.get(pk=erasure.pk)
            removed = ", ".join(f"{key} {n}" for key, n in erasure.removed.items())
            self.stdout.write(f"  {erasure_progress(erasure):.0f} %: {removed}")
            if ran is None and erasure.status != Erasure.Status.DONE:
                time.sleep(1)  # another run holds it (its task): follow it
        self.stdout.write(self.style.SUCCESS(f"Erasure {erasure.pk} done."))
