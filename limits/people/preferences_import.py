"""The import of a file of people's preferences, for a company bringing what its people said in
another tool (`PUT /api/v1/preferences/import/`, `manage.py import_preferences FILE`; both call
`preferences_import`). docs/api.md, "Importing people's preferences", states the formats.

- **JSON lines** (`jsonl`): one object a line, `{"user_id", ...}` with the fields of a person's
  PUT body (limits.people.bodies.PreferencesBody): the whole of that person's preferences.
- **CSV** (`csv`): a header naming the columns (`user_id`, `topic`, `channel`, `subscribed`,
  `paused_until`; `user_id` required, any order), then one choice a row, a person's rows one
  after another (a file sorted by user id); together they are the whole of that person's
  preferences. No frequency: that takes JSON lines.

Either way each person in the file has their preferences replaced by the file's, and everyone
else keeps theirs. Text or gzip (told by its first bytes, as user lists are:
segments.parsing.open_list), UTF-8, blank lines allowed.

All or nothing: the whole file is read and each person checked by the one rule
(limits.people.preferences.preferences_problems, with the topics and rules as they stand when the
import starts) before anything is written; a bad line, or a person twice, refuses the file
naming the lines (the first MAX_PROBLEMS problems). Then it is read again and written BATCH
people at a time, each batch one transaction under PreferenceLock, through the writes of a
single person's (limits.people.preferences.preferences_store): every change journaled with source
`import`. The lock is held for one batch (a fifth of a second at most on SQLite; the batch is
read before it is taken), never for the whole file, so that other changes (the preference page,
the API, the admin) wait no longer than that: a million people under one lock would stop every
other preference change for minutes. A crash while writing leaves the batches committed before
it, each whole; the same file imported again changes only the rest (a person whose preferences
already are the file's is unchanged and journals nothing).

Memory is bounded by a batch and two numbers per person (to find people named twice), never by
the file: an upload is first copied to a temporary file, which is read twice.
"""

import csv
import gzip
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO, Any

import msgspec
import numpy as np
from django.db import transaction
from django.utils import timezone
from rest_framework.exceptions import ParseError, ValidationError

from gatekeeper.lib.bodies import DATETIME_WORDS, DEFAULT_MAX_BODY_BYTES, decode
from gatekeeper.lib.ids import JsonUserId, max_user_id, user_id_from_text
from gatekeeper.lib.problems import Problem as InputProblem
from limits.engine.topics import TopicView
from limits.people.bodies import PreferencesBody
from limits.people.preferences import (
    SOURCES,
    PreferencesFields,
    preference_lock,
    preferences_given,
    preferences_problems,
    preferences_standing,
    preferences_store,
    preferences_user_id,
)
from limits.policy.selectors import policy_cache, topics_read
from segments.parsing import open_list

FORMATS = ("csv", "jsonl")
CONTENT_TYPES = {
    "text/csv": "csv",
    "application/x-ndjson": "jsonl",
    "application/jsonl": "jsonl",
    "application/x-jsonlines": "jsonl",
}
ENDINGS = {"csv": "csv", "jsonl": "jsonl", "ndjson": "jsonl"}
# A file as sent (a gzip counts compressed); a larger upload is a 413.
MAX_UPLOAD_BYTES = 512 * 2**20
# Once decompressed, and its lines: a gzip that inflates beyond these is refused (a million
# people of a few choices each is about 200 MB of JSON lines).
MAX_BYTES = 2**30
MAX_LINES = 1_000_000
# One line is one person (JSON lines) or one choice (CSV): never more than a person's own PUT.
MAX_LINE_BYTES = DEFAULT_MAX_BODY_BYTES
MAX_PROBLEMS = 20  # named in a refusal; the check stops there
BATCH = 1_000  # people a transaction (and a hold of PreferenceLock)
CHUNK_BYTES = 2**20

CSV_COLUMNS = ("user_id", "topic", "channel", "subscribed", "paused_until")
TRUE, FALSE = ("true", "1", "yes"), ("false", "0", "no")


class PreferencesLine(PreferencesBody, kw_only=True):
    """One line of a JSON lines file: a person, and the whole of their preferences (read as a
    REST body's, limits.people.preferences.preferences_user_id; required here)."""

    user_id: JsonUserId


_LINE = msgspec.json.Decoder(PreferencesLine)


@dataclass(frozen=True)
class Problem:
    line: int
    field: str  # "" for the line as a whole
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.field + ': ' if self.field else ''}{self.message}"


class PreferencesFileRefused(Exception):
    """A file that is not imported, and nothing of it written: what is wrong (`problems`, by
    line, the first MAX_PROBLEMS), or a limit it goes past (`messages`, `line` where known)."""

    def __init__(
        self, messages: list[str], *, line: int | None = None, problems: Sequence[Problem] = ()
    ) -> None:
        super().__init__("; ".join(messages))
        self.messages, self.line, self.problems = messages, line, list(problems)

    def field_errors(self) -> dict[str, Any]:
        """Its 400's body (it carries its problems: gatekeeper.lib.problems): the messages, the
        line, and each problem by line and field."""
        problems = [{"line": p.line, "field": p.field, "message": p.message} for p in self.problems]
        return {"file": self.messages, "line": self.line, "problems": problems}


class PreferencesFileTooLarge(Exception):
    """A file larger as sent than MAX_UPLOAD_BYTES (the REST API's 413)."""

    def __init__(self, *, limit: int, size: int | None = None) -> None:
        super().__init__(f"The file is larger than {limit:,} bytes as sent.")
        self.limit, self.size = limit, size


@dataclass
class Imported:
    lines: int  # every line read, header and blank lines included
    people: int
    changed: int  # each journaled
    unchanged: int  # their preferences already were the file's
    checking_seconds: float = 0.0
    writing_seconds: float = 0.0

    def as_json(self) -> dict[str, int]:
        return {
            "lines": self.lines,
            "people": self.people,
            "changed": self.changed,
            "unchanged": self.unchanged,
        }


# (stage: "checked" lines or "written" people, how many so far), at most once a batch.
Progress = Callable[[str, int], None]


def preferences_import(
    *,
    fileobj: IO[bytes],
    file_format: str,
    source: str = "import",
    by: Any = None,
    now: datetime | None = None,
    progress: Progress | None = None,
) -> Imported:
    """Import a file of people's preferences (`file_format`: csv or jsonl), all or nothing.
    Raises PreferencesFileRefused (nothing written) or PreferencesFileTooLarge."""
    import_format(given=file_format)
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}")
    now = now or timezone.now()
    topics = topics_read()
    table = policy_cache().table()
    started = time.monotonic()
    with _rereadable(fileobj) as file:
        read = _check(file, file_format, topics=topics, table=table, now=now, progress=progress)
        checked = time.monotonic()
        file.seek(0)
        changed = written = 0
        # Checked whole above, the file holds no problem when it is read again.
        for batch in _batches(_people(_lines(file), file_format, _Problems(), checked=True)):
            with transaction.atomic():
                preference_lock()
                standing = preferences_standing([p.user_id for p in batch], topics=topics, now=now)
                changed += preferences_store(
                    [(p.user_id, *standing[p.user_id], p.prefs) for p in batch],
                    source=source,
                    by=by,
                )
            written += len(batch)
            if progress is not None:
                progress("written", written)
    return Imported(
        lines=read.lines,
        people=read.people,
        changed=changed,
        unchanged=read.people - changed,
        checking_seconds=checked - started,
        writing_seconds=time.monotonic() - checked,
    )


def import_format(*, given: str | None, content_type: str = "", name: str = "") -> str:
    """The format of a file: `given` (?format=, --format) when said; otherwise told by its
    content type (text/csv; application/x-ndjson, application/jsonl) or by its name's ending
    (.csv, .jsonl, .ndjson, each maybe .gz). PreferencesFileRefused when none tells."""
    if given:
        if given not in FORMATS:
            raise PreferencesFileRefused([f"No format '{given[:20]}': csv or jsonl."])
        return given
    media = content_type.split(";")[0].strip().lower()
    if media in CONTENT_TYPES:
        return CONTENT_TYPES[media]
    ending = name.lower().removesuffix(".gz").rpartition(".")[2]
    if name and ending in ENDINGS:
        return ENDINGS[ending]
    raise PreferencesFileRefused(
        [
            "Say the file's format: csv or jsonl (?format= over HTTP, or a Content-Type of "
            f"{', '.join(CONTENT_TYPES)}; --format, or the file's name ending, for the command)."
        ]
    )


# --- reading --------------------------------------------------------------------------------


@contextmanager
def _rereadable(fileobj: IO[bytes]) -> Iterator[IO[bytes]]:
    """The file as sent, to be read from its start twice: a file on disk as it is, a stream (a
    request's body) copied to a temporary file first. Either refused past MAX_UPLOAD_BYTES."""
    limit = MAX_UPLOAD_BYTES
    seekable = getattr(fileobj, "seekable", None)
    if seekable is not None and seekable():
        size = fileobj.seek(0, 2)
        fileobj.seek(0)
        if size > limit:
            raise PreferencesFileTooLarge(limit=limit, size=size)
        yield fileobj
        return
    with tempfile.TemporaryFile() as copy:
        size = 0
        while chunk := _read(fileobj, CHUNK_BYTES):
            size += len(chunk)
            if size > limit:  # a body without a Content-Length, or one that lied about it
                raise PreferencesFileTooLarge(limit=limit)
            copy.write(chunk)
        copy.seek(0)
        yield copy


def _read(stream: Any, n: int) -> bytes:
    try:
        return bytes(stream.read(n))
    except (OSError, EOFError, zlib.error) as exc:  # a client gone mid-upload, a broken gzip
        raise PreferencesFileRefused([f"The file could not be read: {exc}"]) from exc


def _lines(file: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    """(number, bytes without its line end) of each line, decompressed; refused past
    MAX_BYTES, MAX_LINES or MAX_LINE_BYTES."""
    try:
        stream = open_list(file)
    except (OSError, EOFError, zlib.error) as exc:
        raise PreferencesFileRefused([f"The file could not be read: {exc}"]) from exc
    number, total, carry = 0, 0, b""
    while True:
        chunk = _read(stream, CHUNK_BYTES)
        total += len(chunk)
        if total > MAX_BYTES:
            inflated = " once decompressed" if isinstance(stream, gzip.GzipFile) else ""
            raise PreferencesFileRefused(
                [
                    f"The file is larger than {MAX_BYTES:,} bytes{inflated}, the most a file of "
                    "preferences may be."
                ]
            )
        if chunk:
            parts = (carry + chunk).split(b"\n")
            carry = parts.pop()
        else:
            parts, carry = ([carry] if carry else []), b""
        for part in parts:
            number += 1
            if number > MAX_LINES:
                raise PreferencesFileRefused(
                    [f"The file has more than {MAX_LINES:,} lines, the most it may have."],
                    line=number,
                )
            if len(part) > MAX_LINE_BYTES:
                raise _too_long(number)
            yield number, part.removesuffix(b"\r")
        if len(carry) > MAX_LINE_BYTES:
            raise _too_long(number + 1)
        if not chunk:
            return


def _too_long(number: int) -> PreferencesFileRefused:
    return PreferencesFileRefused(
        [
            f"line {number}: longer than {MAX_LINE_BYTES:,} bytes; one person (JSON lines) or one "
            "choice (CSV) a line."
        ],
        line=number,
    )


@dataclass
class _Person:
    line: int  # their line (CSV: their first row)
    user_id: int
    prefs: PreferencesFields
    refused: bool = False  # a problem is named already: not checked further
    # CSV: the row of each choice (`topics.news.email`), to name it when it is refused.
    rows: dict[str, int] = field(default_factory=dict)

    def line_of(self, name: str) -> int:
        if name in self.rows:
            return self.rows[name]
        within = [line for key, line in self.rows.items() if key.startswith(name + ".")]
        return min(within, default=self.line)


class _Problems:
    def __init__(self) -> None:
        self.found: list[Problem] = []

    def add(self, line: int, name: str, message: str) -> None:
        self.found.append(Problem(line, name, message))

    @property
    def full(self) -> bool:
        return len(self.found) >= MAX_PROBLEMS


def _people(
    lines: Iterator[tuple[int, bytes]], file_format: str, problems: _Problems, *, checked: bool
) -> Iterator[_Person]:
    """The people of the file, one by one; what is wrong with a line goes to `problems`.
    `checked`: the file was read whole and found right (the second reading)."""
    if file_format == "jsonl":
        return _json_people(lines, problems, checked=checked)
    return _csv_people(lines, problems)


def _json_people(
    lines: Iterator[tuple[int, bytes]], problems: _Problems, *, checked: bool
) -> Iterator[_Person]:
    maximum = max_user_id()
    for number, line in lines:
        if problems.full:
            return
        if not line.strip():
            continue
        try:
            # A line checked already is only decoded: `decode`'s checks beyond the type (NUL,
            # depth) ran on it in the first reading, and cost half the second.
            body = _LINE.decode(line) if checked else decode(line, PreferencesLine)
        except ValidationError as exc:
            for name, message in _details(exc.detail):
                problems.add(number, name, message)
            continue
        except ParseError as exc:
            problems.add(number, "", str(exc.detail))
            continue
        try:
            user_id = preferences_user_id(body.user_id, maximum=maximum)
        except ValueError as exc:
            problems.add(number, "user_id", str(exc))
            continue
        yield _Person(number, user_id, preferences_given(body))


def _details(detail: Any, at: str = "") -> Iterator[tuple[str, str]]:
    """A DRF error's (field, message) pairs; the line as a whole for `non_field_errors`."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            yield from _details(value, "" if key == "non_field_errors" else str(key))
    elif isinstance(detail, list):
        for value in detail:
            yield from _details(value, at)
    else:
        yield at, str(detail)


def _csv_people(lines: Iterator[tuple[int, bytes]], problems: _Problems) -> Iterator[_Person]:
    texts = _texts(lines, problems)
    reader = csv.reader(texts, strict=True)
    try:
        header = [name.strip().lower() for name in next(reader, [])]
    except csv.Error as exc:
        problems.add(1, "", f"Not CSV: {exc}.")
        return
    columns = _columns(header, problems)
    if columns is None:
        return
    maximum = max_user_id()
    person: _Person | None = None
    while not problems.full:
        try:
            row = next(reader, None)
        except csv.Error as exc:
            problems.add(reader.line_num, "", f"Not CSV: {exc}.")
            continue
        if row is None:
            break
        number = reader.line_num
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(columns):
            problems.add(number, "", f"{len(row)} cells; the header names {len(columns)}.")
            continue
        cells = {name: cell.strip() for name, cell in zip(columns, row, strict=True)}
        try:
            user_id = user_id_from_text(cells["user_id"], field="user_id", maximum=maximum)
        except InputProblem as exc:
            problems.add(number, exc.field, exc.message)
            continue
        if person is None or person.user_id != user_id:
            if person is not None:
                yield person
            person = _Person(number, user_id, PreferencesFields())
        _choice(person, cells, number, problems)
    if person is not None:
        yield person


def _texts(lines: Iterator[tuple[int, bytes]], problems: _Problems) -> Iterator[str]:
    """Each line as text for the csv reader, one for one (so its line_num is the line's
    number); a line that is not UTF-8 is named and read as blank."""
    for number, line in lines:
        try:
            text = line.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError:
            problems.add(number, "", "Not UTF-8 text.")
            text = ""
        yield text + "\n"


def _columns(header: list[str], problems: _Problems) -> list[str] | None:
    known = ", ".join(CSV_COLUMNS)
    unknown = [name for name in header if name not in CSV_COLUMNS]
    if unknown or "user_id" not in header or len(set(header)) != len(header):
        said = f"Unknown column '{unknown[0][:40]}'. " if unknown else ""
        problems.add(1, "", f"{said}The first line names the columns, each once, `user_id` "
                     f"among them: {known}.")  # fmt: skip
        return None
    return header


def _choice(person: _Person, cells: dict[str, str], number: int, problems: _Problems) -> None:
    """Add a CSV row's choice to the person's preferences: a topic on a channel (topic,
    channel, subscribed), a channel on or off (channel, subscribed), a pause of a channel
    (channel, paused_until) or of everything (paused_until); a row with none says nothing."""
    if person.refused:
        return
    prefs = person.prefs
    topic, channel = cells.get("topic", ""), cells.get("channel", "")
    subscribed, until = cells.get("subscribed", ""), cells.get("paused_until", "")
    if not (topic or channel or subscribed or until):
        return  # the person, saying nothing: their preferences go back to the defaults
    if (
        (subscribed and (until or not channel))
        or (topic and not subscribed)
        or not (subscribed or until)
    ):
        problems.add(number, "", "One choice a row: topic, channel and subscribed; channel and "
                     "subscribed; channel and paused_until; or paused_until alone.")  # fmt: skip
        person.refused = True
        return
    if subscribed:
        value = subscribed.lower()
        if value not in TRUE + FALSE:
            problems.add(number, "subscribed", "true or false (or 1 and 0, yes and no).")
            person.refused = True
            return
        on = value in TRUE
        if topic:
            name, choices = f"topics.{topic}.{channel}", prefs.topics.setdefault(topic, {})
        else:
            name, choices = f"channels.{channel}", prefs.channels
        if channel in choices:
            _twice(person, name, number, problems)
            return
        choices[channel] = on
        person.rows[name] = number
        return
    try:
        instant = msgspec.convert(until, datetime)
    except msgspec.ValidationError:
        problems.add(number, "paused_until", DATETIME_WORDS)
        person.refused = True
        return
    if channel:
        name = f"paused_channels.{channel}"
        if channel in prefs.paused_channels:
            _twice(person, name, number, problems)
            return
        prefs.paused_channels[channel] = instant
    else:
        name = "paused_until"
        if prefs.paused_until is not None:
            _twice(person, name, number, problems)
            return
        prefs.paused_until = instant
    person.rows[name] = number


def _twice(person: _Person, name: str, number: int, problems: _Problems) -> None:
    problems.add(number, name[:150], f"A second choice for user {person.user_id}; line "
                 f"{person.rows[name]} has the first.")  # fmt: skip
    person.refused = True


# --- checking -------------------------------------------------------------------------------


@dataclass
class _Read:
    lines: int
    people: int


def _check(
    file: IO[bytes],
    file_format: str,
    *,
    topics: dict[str, TopicView],
    table: Any,
    now: datetime,
    progress: Progress | None,
) -> _Read:
    """Read the whole file and check every person; PreferencesFileRefused naming the first
    MAX_PROBLEMS problems (by line), people twice included."""
    problems = _Problems()
    user_ids: list[int] = []
    first_lines: list[int] = []
    counter = _Counting(_lines(file))
    for person in _people(counter, file_format, problems, checked=False):
        user_ids.append(person.user_id)
        first_lines.append(person.line)
        if not person.refused:
            wrong = preferences_problems(person.prefs, topics=topics, now=now, table=table)
            for name, messages in wrong.items():
                for message in messages:
                    problems.add(person.line_of(name), name, message)
        if progress is not None and len(user_ids) % BATCH == 0:
            progress("checked", counter.lines)
        if problems.full:
            break
    found = problems.found + _twice_in_file(user_ids, first_lines, file_format)
    if found:
        found.sort(key=lambda p: p.line)
        shown = found[:MAX_PROBLEMS]
        messages = [str(p) for p in shown]
        if problems.full or len(found) > MAX_PROBLEMS:
            messages.append(f"The check stopped at the first {MAX_PROBLEMS} problems.")
        raise PreferencesFileRefused(messages, line=shown[0].line, problems=shown)
    return _Read(lines=counter.lines, people=len(user_ids))


class _Counting:
    """The lines, counted as they go by."""

    def __init__(self, lines: Iterator[tuple[int, bytes]]) -> None:
        self._lines, self.lines = lines, 0

    def __iter__(self) -> "_Counting":
        return self

    def __next__(self) -> tuple[int, bytes]:
        number, line = next(self._lines)
        self.lines = number
        return number, line


def _twice_in_file(user_ids: list[int], lines: list[int], file_format: str) -> list[Problem]:
    """A person named twice: a problem at the second place, naming the first."""
    if len(user_ids) < 2:
        return []
    ids = np.asarray(user_ids, dtype=np.uint64)
    order = np.argsort(ids, kind="stable")  # of one user, their places in file order
    again = np.flatnonzero(ids[order][1:] == ids[order][:-1])
    how = (
        "a person's rows follow one another (sort the file by user_id)"
        if file_format == "csv"
        else "a person once a file, all their preferences on one line"
    )
    found = []
    for k in again[: MAX_PROBLEMS + 1]:
        first, second = lines[int(order[k])], lines[int(order[k + 1])]
        found.append(
            Problem(
                second, "user_id", f"User {user_ids[int(order[k])]} is on line {first} too: {how}."
            )
        )
    return found


def _batches(people: Iterator[_Person]) -> Iterator[list[_Person]]:
    batch: list[_Person] = []
    for person in people:
        batch.append(person)
        if len(batch) == BATCH:
            yield batch
            batch = []
    if batch:
        yield batch
