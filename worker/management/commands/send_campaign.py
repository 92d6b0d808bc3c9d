"""manage.py send_campaign: hand a campaign's recipients (a CSV file) to the gate and send them."""

import csv
from collections import Counter
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from gatekeeper.lib.words import count
from worker.chunks import ChunkBusy, send_chunk_run
from worker.models import SendChunk, SendJob
from worker.services import send_job_create


class Command(BaseCommand):
    help = (
        "Send a campaign to the recipients in a CSV file (user_id,address[,message_id], an "
        "optional header line). Queues it for the worker, or with --wait sends it here."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--channel", required=True)
        parser.add_argument("--template", required=True, help="templates/<channel>/<template>/")
        parser.add_argument("--recipients", required=True, help="CSV file")
        parser.add_argument("--campaign", help="campaign name (default: the template's name)")
        parser.add_argument(
            "--category", default="marketing", choices=["marketing", "transactional"]
        )
        parser.add_argument("--on-capped", default="drop", choices=["drop", "defer"])
        parser.add_argument(
            "--on-invalid",
            default="reject",
            choices=["reject", "skip"],
            help="reject: a bad row sends nothing; skip: bad rows are counted as invalid",
        )
        parser.add_argument("--wait", action="store_true", help="gate and send in this process")

    def handle(self, *args: Any, **options: Any) -> None:
        campaign = options["campaign"] or options["template"]
        self._lines: list[int] = []  # the file line of each recipient, for error messages
        rows = list(self._read(options["recipients"], campaign))
        try:
            job = send_job_create(
                channel=options["channel"],
                campaign=campaign,
                template=options["template"],
                category=options["category"],
                on_capped=options["on_capped"],
                on_invalid=options["on_invalid"],
                recipients=rows,
                queue=not options["wait"],
            )
        except ValidationError as exc:
            problems = "; ".join(
                f"{self._where(options['recipients'], k)}: {' '.join(v)}"
                for k, v in exc.message_dict.items()
            )
            raise CommandError(f"Nothing was sent. {problems}") from exc
        if not options["wait"]:
            self.stdout.write(
                f"Send job #{job.pk} queued: {count(job.total, 'recipient')} in "
                f"{count(job.chunks.count(), 'chunk')}."
            )
            return
        with tqdm(total=job.total, unit="recipient", desc="sending", disable=None) as bar:
            for chunk in SendChunk.objects.filter(job=job).order_by("pk"):
                try:
                    outcome = send_chunk_run(chunk_id=chunk.pk)
                except ChunkBusy:
                    continue  # a worker is running this one
                bar.update(sum(outcome.values()))
        job.refresh_from_db()
        self._summary(job)

    def _read(self, path: str, campaign: str) -> Any:
        """Rows as the service takes them. The user id is left as the file wrote it: the
        service applies the one rule for ids (and names the row) like for any caller."""
        try:
            with open(path, newline="", encoding="utf-8") as handle:
                for line_no, row in enumerate(csv.reader(handle), start=1):
                    first = row[0].strip() if row else ""
                    if not row or (line_no == 1 and not (first.isascii() and first.isdigit())):
                        continue  # blank lines, and a header line
                    if len(row) < 2:
                        raise CommandError(
                            f"{path} line {line_no}: expected user_id,address[,message_id], "
                            f"got {row!r}."
                        )
                    message_id = row[2].strip() if len(row) > 2 and row[2].strip() else None
                    self._lines.append(line_no)
                    yield {"user_id": row[0], "address": row[1].strip(), "message_id": message_id}
        except (OSError, UnicodeDecodeError, csv.Error) as exc:
            raise CommandError(f"Cannot read {path}: {exc}") from exc

    def _where(self, path: str, field: str) -> str:
        """`recipients[3].address` as the file's line: `recipients.csv line 5 (address)`."""
        if field.startswith("recipients["):
            index, _, rest = field[len("recipients[") :].partition("]")
            if index.isdigit() and int(index) < len(self._lines):
                return f"{path} line {self._lines[int(index)]} ({rest.lstrip('.')})"
        return field

    def _summary(self, job: SendJob) -> None:
        self.stdout.write(f"\nSend job #{job.pk} ({job.campaign}, {job.channel}): {job.status}")
        for outcome in (*SendJob.OUTCOMES, "pending"):
            self.stdout.write(f"  {outcome:<14}{getattr(job, outcome):>10,}")
        self.stdout.write("\n  gate decisions by reason:")
        for reason, decisions in Counter(job.reasons).most_common():
            self.stdout.write(f"  {reason:<14}{decisions:>10,}")
        pending = job.chunks.filter(status=SendChunk.Status.QUEUED).count()
        if pending:
            self.stdout.write(
                f"\n  {pending} chunk(s) deferred: a worker sends them when slots free."
            )
