"""manage.py send_campaign: hand a campaign's recipients (a CSV file) to the gate and send them."""

import csv
from collections import Counter
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from worker.models import SendChunk, SendJob
from worker.services import ChunkBusy, send_chunk_run, send_job_create


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
        parser.add_argument("--wait", action="store_true", help="gate and send in this process")

    def handle(self, *args: Any, **options: Any) -> None:
        campaign = options["campaign"] or options["template"]
        rows = list(self._read(options["recipients"], campaign))
        try:
            job = send_job_create(
                channel=options["channel"],
                campaign=campaign,
                template=options["template"],
                category=options["category"],
                on_capped=options["on_capped"],
                recipients=rows,
                queue=not options["wait"],
            )
        except ValidationError as exc:
            problems = "; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())
            raise CommandError(f"Nothing was sent. {problems}") from exc
        if not options["wait"]:
            self.stdout.write(
                f"Send job #{job.pk} queued: {job.total:,} recipients in {job.chunks.count()} chunks."
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
        try:
            with open(path, newline="") as handle:
                for line_no, row in enumerate(csv.reader(handle), start=1):
                    if not row or (line_no == 1 and not row[0].strip().isdigit()):
                        continue
                    if len(row) < 2 or not row[0].strip().isdigit():
                        raise CommandError(
                            f"{path} line {line_no}: expected user_id,address[,message_id], got {row!r}."
                        )
                    user_id = int(row[0])
                    message_id = (
                        row[2].strip()
                        if len(row) > 2 and row[2].strip()
                        else f"{campaign}:{user_id}"
                    )
                    yield {"user_id": user_id, "address": row[1].strip(), "message_id": message_id}
        except OSError as exc:
            raise CommandError(f"Cannot read {path}: {exc}") from exc

    def _summary(self, job: SendJob) -> None:
        self.stdout.write(f"\nSend job #{job.pk} ({job.campaign}, {job.channel}): {job.status}")
        self.stdout.write(f"  {'sent':<14}{job.sent:>10,}")
        self.stdout.write(f"  {'failed':<14}{job.failed:>10,}")
        self.stdout.write("\n  gate decisions by reason:")
        for reason, count in Counter(job.reasons).most_common():
            self.stdout.write(f"  {reason:<14}{count:>10,}")
        pending = job.chunks.filter(status=SendChunk.Status.QUEUED).count()
        if pending:
            self.stdout.write(
                f"\n  {pending} chunk(s) deferred: a worker sends them when slots free."
            )
