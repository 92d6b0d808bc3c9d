"""manage.py send_campaign: hand a campaign's recipients (a CSV file) to the gate and send them."""

import time
from collections import Counter
from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from gatekeeper.lib.bodies import datetime_from_text
from gatekeeper.lib.ids import DATABASE_MAX
from gatekeeper.lib.integers import NotAWholeNumber, whole_number
from gatekeeper.lib.words import count
from limits.engine.table import DEFAULT_PRIORITY, PRIORITIES
from limits.reasons import CATEGORIES, Category
from worker import tasks, timings
from worker.chunks import ChunkBusy, send_chunk_run
from worker.models import SendJob
from worker.preparing import send_job_prepare_run
from worker.recipients import FILE_FORMAT, RowError, value_from_cell
from worker.selectors import send_job_waiting
from worker.services import send_job_from_file

JOB_OPTIONS = (
    "tags",
    "priority",
    "channel",
    "template",
    "campaign",
    "expires_at",
    "start_at",
    "reserve",
    "topic",
    "round",
    "value",
)


class Command(BaseCommand):
    help = (
        f"Send a campaign to the recipients in a CSV file (plain or gzip): {FILE_FORMAT}. Reads "
        "and checks the file here, handing what was read to the workers as it goes (--follow "
        "shows their progress), or with --wait reads all of it, then sends it here."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--channel", required=True)
        parser.add_argument("--template", required=True, help="templates/<channel>/<template>/")
        parser.add_argument("--recipients", required=True, help="CSV file")
        parser.add_argument("--campaign", help="campaign name (default: the template's name)")
        parser.add_argument("--category", default=Category.MARKETING, choices=CATEGORIES)
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
            "--topic",
            default="",
            help="what the sends are about: a topic's slug, sent on the channel (default: none)",
        )
        parser.add_argument(
            "--on-capped",
            default="drop",
            choices=["drop", "defer"],
            help="defer: sends refused by a cap or quiet hours wait for their release",
        )
        parser.add_argument(
            "--start-at",
            help="ISO 8601 with its UTC offset (2026-06-11T09:00:00+02:00): the job waits as "
            "scheduled until then (beat starts it; edit or cancel it meanwhile in the admin or "
            "over REST); default: at once",
        )
        parser.add_argument(
            "--reserve",
            action="store_true",
            help="with --start-at: until it starts, its predicted sends hold their slots (an "
            "earlier send of a lower priority that would take one is refused)",
        )
        parser.add_argument(
            "--round",
            help="a round's id: the job competes in it (on its channel, not reserved) and "
            "starts at its send time once it is decided",
        )
        parser.add_argument(
            "--value",
            help="with --round: what one send is worth, a number of at least 0 (default: each "
            "recipient's own, the file's value column)",
        )
        parser.add_argument(
            "--expires-at",
            help="ISO 8601 with its UTC offset (2026-06-11T09:00:00+02:00): deferred sends "
            "still waiting then are dropped as expired (default: 24 hours after the start)",
        )
        parser.add_argument(
            "--on-invalid",
            default="reject",
            choices=["reject", "skip"],
            help="reject: a bad row sends nothing; skip: bad rows are counted as invalid",
        )
        parser.add_argument("--wait", action="store_true", help="gate and send in this process")
        parser.add_argument(
            "--follow",
            action="store_true",
            help="after queueing, show the workers' progress until the job ends",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        campaign = options["campaign"] or options["template"]
        try:
            priority = whole_number(
                options["priority"], maximum=PRIORITIES[1], minimum=PRIORITIES[0], what="--priority"
            )
        except NotAWholeNumber as exc:
            raise CommandError(f"Nothing was sent. {exc}") from None
        tags = [tag.strip() for tag in options["tags"].split(",") if tag.strip()]
        expires_at = self._instant(options, "expires_at")
        start_at = self._instant(options, "start_at")
        round_id, value = self._round(options)
        for later, option in ((start_at, "--start-at"), (round_id, "--round")):
            if later is not None and options["wait"]:
                raise CommandError(
                    f"Nothing was sent. --wait sends in this process now; a job with {option} is "
                    "started by beat at its time (leave out one of the two)."
                )
        path = options["recipients"]
        try:
            handle = Path(path).open("rb")  # noqa: SIM115 (closed by the reading below)
        except OSError as exc:
            raise CommandError(f"Cannot read {path}: {exc}") from exc
        try:
            job = send_job_from_file(
                fileobj=handle,
                name=path,
                queue=False,
                keep_upload=False,
                channel=options["channel"],
                campaign=campaign,
                template=options["template"],
                category=options["category"],
                tags=tags,
                priority=priority,
                topic=options["topic"],
                on_capped=options["on_capped"],
                on_invalid=options["on_invalid"],
                expires_at=expires_at,
                start_at=start_at,
                reserve=options["reserve"],
                round=round_id,
                value=value,
            )
        except ValidationError as exc:
            handle.close()
            problems = "; ".join(
                f"{self._where(path, k)}: {' '.join(v)}" for k, v in exc.message_dict.items()
            )
            raise CommandError(f"Nothing was sent. {problems}") from exc
        with tqdm(
            total=job.source_bytes, unit="B", unit_scale=True, desc="reading", disable=None
        ) as bar:

            def progress(read: int, _size: int) -> None:
                bar.update(read - bar.n)

            # Without --wait, the workers send what was read while the rest is read here.
            handed: list[int] = []

            def hand_out(ids: list[int]) -> None:
                tasks.send_chunks(ids)
                handed.extend(ids)

            ids = send_job_prepare_run(
                job_id=job.pk,
                stream=(handle, job.source_bytes),
                progress=progress,
                hand_out=None if options["wait"] else hand_out,
            )
        job.refresh_from_db()
        if job.status == SendJob.Status.FAILED:
            raise CommandError(f"{path}: {job.error}")
        if job.status == SendJob.Status.SCHEDULED and job.round is not None:
            self.stdout.write(
                f"Send job #{job.pk} joined round #{job.round.pk} ({job.round.name}): "
                f"{count(job.total, 'recipient')}; the round closes at "
                f"{job.round.closes_at:%Y-%m-%d %H:%M:%S} UTC and its chosen sends start at "
                f"{job.round.send_at:%Y-%m-%d %H:%M:%S} UTC (until it closes the job can leave "
                "it or change its value in the admin or over REST)."
            )
            if options["follow"]:
                self._follow(job)
            return
        if job.status == SendJob.Status.SCHEDULED:
            assert job.start_at is not None
            self.stdout.write(
                f"Send job #{job.pk} scheduled for {job.start_at:%Y-%m-%d %H:%M:%S} UTC: "
                f"{count(job.total, 'recipient')}; beat starts it then (until then it can be "
                "edited, rescheduled or cancelled in the admin or over REST)."
            )
            if options["follow"]:
                self._follow(job)
            return
        if not options["wait"]:
            tasks.send_chunks(ids)
            timings.flush()  # this process's reading and chunking, for /metrics
            self.stdout.write(
                f"Send job #{job.pk} queued: {count(job.total, 'recipient')} in "
                f"{count(len(handed) + len(ids), 'chunk')}."
            )
            if options["follow"]:
                self._follow(job)
            return
        with tqdm(total=job.total, unit="recipient", desc="sending", disable=None) as bar:
            bar.update(job.processed)  # invalid rows and repeats, settled when read
            for chunk_id in ids:
                try:
                    outcome = send_chunk_run(chunk_id=chunk_id)
                except ChunkBusy:
                    continue  # a worker is running this one
                bar.update(sum(outcome.values()))
                bar.set_postfix(waiting=send_job_waiting(job.pk)["sends"], refresh=False)
        timings.flush()
        job.refresh_from_db()
        self._summary(job)

    def _follow(self, job: SendJob) -> None:
        """The workers' progress on the job, until every send has an outcome (or only waiting
        sends are left); Ctrl-C stops watching, not the job."""
        with tqdm(total=job.total, unit="recipient", desc="sending", disable=None) as bar:
            try:
                while True:
                    job.refresh_from_db()
                    bar.update(job.processed - bar.n)
                    waiting = send_job_waiting(job.pk)["sends"]
                    bar.set_postfix(status=job.status, waiting=waiting, refresh=False)
                    if job.ended or (job.pending and job.pending == waiting):
                        break
                    time.sleep(0.5)
            except KeyboardInterrupt:
                self.stdout.write(f"\nStopped watching; job #{job.pk} goes on.")
                return
        self._summary(job)

    @staticmethod
    def _instant(options: dict[str, Any], name: str) -> Any:
        """An instant option (--start-at, --expires-at) read, or None; without a UTC offset,
        the service refuses it in the words of the API."""
        if not options[name]:
            return None
        try:
            return datetime_from_text(options[name])
        except ValueError as exc:
            option = "--" + name.replace("_", "-")
            raise CommandError(f"Nothing was sent. {option}: {exc}") from None

    @staticmethod
    def _round(options: dict[str, Any]) -> tuple[int | None, float | None]:
        """--round (a whole number) and --value (a number, as a file's value cell is read); the
        service says whether the round may be joined and the value is one."""
        round_id = None
        if options["round"]:
            try:
                round_id = whole_number(
                    options["round"], maximum=DATABASE_MAX, minimum=1, what="--round"
                )
            except NotAWholeNumber as exc:
                raise CommandError(f"Nothing was sent. {exc}") from None
        value = None
        if options["value"]:
            try:
                value = value_from_cell(options["value"])
            except RowError as exc:
                raise CommandError(f"Nothing was sent. --value: {exc.message}") from None
        return round_id, value

    @staticmethod
    def _where(path: str, field: str) -> str:
        """The job's fields as the options that set them (`--tags`); the file by its path."""
        if field in JOB_OPTIONS:
            return f"--{field.replace('_', '-')}"
        if field == "recipients_file":
            return path
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
