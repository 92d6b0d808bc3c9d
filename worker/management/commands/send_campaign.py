"""manage.py send_campaign: hand a campaign's recipients (a CSV file) to the gate and send them."""

import csv
from collections import Counter
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from gatekeeper.lib.bodies import datetime_from_text
from gatekeeper.lib.integers import NotAWholeNumber, whole_number
from gatekeeper.lib.words import count
from limits.policy import DEFAULT_PRIORITY, PRIORITIES
from worker.chunks import ChunkBusy, send_chunk_run
from worker.models import SendJob
from worker.selectors import send_job_waiting
from worker.services import send_job_create

COLUMNS = ("user_id", "address", "message_id", "time_zone")
POSITIONAL = ("user_id", "address", "message_id")  # a file without a header line


class Command(BaseCommand):
    help = (
        "Send a campaign to the recipients in a CSV file: user_id,address[,message_id], or the "
        "columns a header line names (user_id, address, message_id, time_zone, in any order). "
        "Queues it for the worker, or with --wait sends it here."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--channel", required=True)
        parser.add_argument("--template", required=True, help="templates/<channel>/<template>/")
        parser.add_argument("--recipients", required=True, help="CSV file")
        parser.add_argument("--campaign", help="campaign name (default: the template's name)")
        parser.add_argument(
            "--category", default="marketing", choices=["marketing", "transactional"]
        )
        parser.add_argument(
            "--tags",
            default="",
            help="the sends' tags, comma separated (tag rules count them)",
        )
        parser.add_argument(
            "--priority",
            default=str(DEFAULT_PRIORITY),
            help=f"{PRIORITIES[0]} to {PRIORITIES[1]}, higher is more important (default "
            f"{DEFAULT_PRIORITY}); only a rule's reserve reads it",
        )
        parser.add_argument(
            "--on-capped",
            default="drop",
            choices=["drop", "defer"],
            help="defer: sends refused by a cap or quiet hours wait for their release",
        )
        parser.add_argument(
            "--expires-at",
            help="ISO 8601 with its UTC offset (2026-06-11T09:00:00+02:00): deferred sends "
            "still waiting then are dropped as expired (default: 24 hours from now)",
        )
        parser.add_argument(
            "--on-invalid",
            default="reject",
            choices=["reject", "skip"],
            help="reject: a bad row sends nothing; skip: bad rows are counted as invalid",
        )
        parser.add_argument("--wait", action="store_true", help="gate and send in this process")

    def handle(self, *args: Any, **options: Any) -> None:
        campaign = options["campaign"] or options["template"]
        try:
            priority = whole_number(
                options["priority"], maximum=PRIORITIES[1], minimum=PRIORITIES[0], what="--priority"
            )
        except NotAWholeNumber as exc:
            raise CommandError(f"Nothing was sent. {exc}") from None
        tags = [tag.strip() for tag in options["tags"].split(",") if tag.strip()]
        expires_at = None
        if options["expires_at"]:
            try:
                # Without a UTC offset, send_job_create refuses it (in the words of the API).
                expires_at = datetime_from_text(options["expires_at"])
            except ValueError as exc:
                raise CommandError(f"Nothing was sent. --expires-at: {exc}") from None
        self._lines: list[int] = []  # the file line of each recipient, for error messages
        rows = list(self._read(options["recipients"]))
        try:
            job = send_job_create(
                channel=options["channel"],
                campaign=campaign,
                template=options["template"],
                category=options["category"],
                tags=tags,
                priority=priority,
                on_capped=options["on_capped"],
                on_invalid=options["on_invalid"],
                expires_at=expires_at,
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
            bar.update(job.processed)  # invalid rows and repeats, settled at creation
            for chunk_id in job.chunks.order_by("pk").values_list("pk", flat=True):
                try:
                    outcome = send_chunk_run(chunk_id=chunk_id)
                except ChunkBusy:
                    continue  # a worker is running this one
                bar.update(sum(outcome.values()))
                bar.set_postfix(waiting=send_job_waiting(job.pk)["sends"], refresh=False)
        job.refresh_from_db()
        self._summary(job)

    def _read(self, path: str) -> Any:
        """Rows as the service takes them. Values are left as the file wrote them: the service
        applies the one rule for ids, addresses and time zones (and names the row) like for any
        caller. An empty message id or time zone cell is no value."""
        columns: tuple[str, ...] = POSITIONAL
        at = {name: i for i, name in enumerate(columns)}  # a column's position in a row
        try:
            with open(path, newline="", encoding="utf-8") as handle:
                for line_no, row in enumerate(csv.reader(handle), start=1):
                    first = row[0].strip() if row else ""
                    if not first and not any(cell.strip() for cell in row):
                        continue  # a blank line
                    if line_no == 1 and not (first.isascii() and first.isdigit()):
                        columns = self._header(path, row)
                        at = {name: i for i, name in enumerate(columns)}
                        continue
                    if columns is POSITIONAL and len(row) < 2:
                        raise CommandError(
                            f"{path} line {line_no}: expected user_id,address[,message_id], "
                            f"got {row!r}."
                        )
                    if columns is not POSITIONAL and len(row) != len(columns):
                        raise CommandError(
                            f"{path} line {line_no}: expected {','.join(columns)} (as the "
                            f"header says), got {row!r}."
                        )
                    # Per row: only the cells there are, by position (a million rows: no dicts
                    # built to be read once).
                    message_id = (
                        row[at["message_id"]].strip()
                        if "message_id" in at and len(row) > at["message_id"]
                        else ""
                    )
                    recipient: dict[str, Any] = {
                        "user_id": row[at["user_id"]].strip(),
                        "address": row[at["address"]].strip(),
                        "message_id": message_id or None,
                    }
                    if "time_zone" in at:
                        zone_name = row[at["time_zone"]].strip()
                        if zone_name:
                            recipient["time_zone"] = zone_name
                    self._lines.append(line_no)
                    yield recipient
        except (OSError, UnicodeDecodeError, csv.Error) as exc:
            raise CommandError(f"Cannot read {path}: {exc}") from exc

    @staticmethod
    def _header(path: str, row: list[str]) -> tuple[str, ...]:
        """The columns a header line names; every name known, user_id and address present."""
        names = tuple(cell.strip().lower() for cell in row)
        unknown = [name for name in names if name not in COLUMNS]
        repeated = [name for name in names if names.count(name) > 1]
        missing = [name for name in ("user_id", "address") if name not in names]
        if unknown:
            problem = f"unknown column '{unknown[0][:40]}'"
        elif repeated:
            problem = f"the column {repeated[0]} is named twice"
        elif missing:
            problem = f"no {missing[0]} column"
        else:
            return names
        raise CommandError(
            f"{path} line 1 (the header): {problem}. Columns: {', '.join(COLUMNS)} "
            "(user_id and address required, in any order)."
        )

    def _where(self, path: str, field: str) -> str:
        """`recipients[3].address` as the file's line: `recipients.csv line 5 (address)`;
        the job's fields as the options that set them (`--tags`)."""
        if field in ("tags", "priority", "channel", "template", "campaign", "expires_at"):
            return f"--{field.replace('_', '-')}"
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
        waiting = send_job_waiting(job.pk)
        if waiting["sends"]:
            self.stdout.write(
                f"\n  {count(waiting['sends'], 'send')} waiting for release (a cap or quiet "
                f"hours), from {waiting['next_at']:%Y-%m-%d %H:%M} to "
                f"{waiting['last_at']:%Y-%m-%d %H:%M} UTC: the workers send them then; "
                f"still waiting at {job.expires_at:%Y-%m-%d %H:%M} UTC, they expire."
            )
