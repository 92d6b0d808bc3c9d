"""A send job's recipients: the one set of rules a recipient row is checked by (a JSON body's or a
file's), and campaign files read as a stream.

A campaign file is CSV, plain or gzip (recognised by its bytes): `user_id,address[,time_zone]
[,context]`, or the columns a header line names, in any order (user_id and address required).
`context` is a JSON object (the template's variables), CSV-quoted. `value` (by a header only):
what the recipient's send is worth in a round (a number >= 0), replacing the job's own. Every send of a file has the
message id `<campaign>:<user_id>`: a user listed twice gets one send and the repeat counts as a
duplicate, which a bitmap of the user ids seen finds in bounded memory (about 1.2 bits per user
of a dense list), so a file of any length is read in constant memory apart from that bitmap.
Per-send message ids are for JSON bodies.

Reading is done by `recipient_lines`, which yields each line's recipient or its problem with the
line number; `worker.preparing` stages what it reads in chunks and hands them to the workers as
it goes.
"""

import csv
import io
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError
from pyroaring import BitMap, BitMap64

from gatekeeper.lib.bodies import json_value_problem
from gatekeeper.lib.ids import max_user_id, user_id_from_json
from gatekeeper.lib.zones import UnknownTimeZone, zone
from segments.parsing import open_list
from worker.delivery.registry import address_rule
from worker.models import MESSAGE_ID_MAX

READ_BYTES = 1 << 20  # read and decoded a MiB at a time
CONTEXT_DEPTH = 16  # levels of arrays and objects a recipient's template context may nest
COLUMNS = ("user_id", "address", "time_zone", "context", "value")
# The columns a file without a header has, in this order (a value is named by a header).
POSITIONAL = COLUMNS[:4]
REQUIRED = ("user_id", "address")
FILE_FORMAT = (
    "user_id,address[,time_zone][,context as a JSON object], or a header line naming the "
    "columns (user_id and address required; time_zone, context, value) in any order"
)
VALUE_WORDS = "a number of at least 0, such as 2.5"
# A file's value cell: a decimal number (a sign to be told it is below 0), or NaN and infinity
# in the words Python reads (to be told they are not finite); anything else is not a number.
_VALUE_CELL = re.compile(r"-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
_NOT_FINITE = frozenset({"nan", "-nan", "inf", "-inf", "infinity", "-infinity"})
# csv's own limit on a cell is 128 KiB; a context may be as large as a JSON body allows one.
csv.field_size_limit(1 << 20)


class RowError(Exception):
    """A recipient that cannot be sent to: the field at fault and why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field, self.message = field, message


class FileError(ValidationError):
    """A campaign file that cannot be read as one (not UTF-8, a broken gzip, a bad header): the
    whole file is refused, whatever `on_invalid` says. `line` is where, when known; `field`, the
    job's field at fault when it is not the file itself (a round job without a value column)."""

    def __init__(self, message: str, *, line: int | None = None, field: str = "") -> None:
        where = f"line {line:,}: " if line is not None else ""
        super().__init__(f"{where}{message}", code="recipients_file")
        self.line, self.field = line, field


def value_problem(value: object) -> str | None:
    """The one rule for what a send is worth in a round (a job's `value`, a recipient's own): a
    finite number of at least 0. None when it is one, else what is wrong, in words."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"Must be {VALUE_WORDS}; {str(value)[:40]!r} is not a number."
    if not math.isfinite(value):
        return f"Must be {VALUE_WORDS}; {value} is not a finite number."
    if value < 0:
        return f"Must be {VALUE_WORDS}; {value} is below 0."
    return None


def value_from_cell(cell: str) -> float | None:
    """A file's value cell as a number (None: empty), or a RowError naming `value`."""
    text = cell.strip()
    if not text:
        return None
    if not (_VALUE_CELL.fullmatch(text) or text.lower() in _NOT_FINITE):
        raise RowError("value", f"Must be {VALUE_WORDS}; {text[:40]!r} is not a number.")
    return float(text)


class RecipientRules:
    """The checks of one job's recipients (its channel's addresses, the id width), built once
    per job: `recipient` applies them to one row's values. `value_required`: the job is in a
    round and has no value of its own, so every recipient must carry one (a row without is
    invalid; a file must name a `value` column)."""

    def __init__(self, *, channel: str, campaign: str, value_required: bool = False) -> None:
        self.campaign = campaign
        self.address_problem: Callable[[str], str | None] = address_rule(channel)
        self.maximum = max_user_id()
        self.value_required = value_required

    @classmethod
    def of_job(cls, job: Any) -> "RecipientRules":
        """The rules of a stored job's recipients (a SendJob: its file read in the background)."""
        return cls(
            channel=job.channel,
            campaign=job.campaign,
            value_required=job.round_id is not None and job.value is None,
        )

    def columns_checked(self, columns: Iterable[str]) -> None:
        """A file's columns (its header's, or the positional ones) against the job: a round job
        without a value of its own needs a `value` column (a FileError naming `value`)."""
        if self.value_required and "value" not in columns:
            raise FileError(
                "The job is in a round and has no value of its own: give it a `value`, or "
                "each recipient one in a `value` column (named by a header line).",
                field="value",
            )

    def recipient(
        self,
        user_id: Any,
        address: Any,
        *,
        message_id: Any = None,
        context: Any = None,
        time_zone: Any = None,
        value: Any = None,
    ) -> dict[str, Any]:
        """The recipient as a chunk stores it; raises RowError naming the field. `user_id` as
        JSON gives it (an integer or its digits), `context` a dict (or None: no variables),
        `value` a number (None: the job's)."""
        try:
            user = user_id_from_json(user_id, maximum=self.maximum)
        except ValueError as exc:
            raise RowError("user_id", str(exc)) from None
        if not isinstance(address, str) or not address:
            raise RowError(
                "address", "An address is required (an email address, push token or phone number)."
            )
        problem = self.address_problem(address)
        if problem:
            raise RowError("address", problem)
        message_id = message_id or f"{self.campaign}:{user}"
        if not isinstance(message_id, str) or len(message_id) > MESSAGE_ID_MAX:
            raise RowError(
                "message_id", f"A message id is a string of at most {MESSAGE_ID_MAX} characters."
            )
        if "\x00" in message_id:
            raise RowError("message_id", "Must not contain the NUL character (\\u0000).")
        context = context or {}
        if not isinstance(context, dict):
            raise RowError("context", "Must be an object (the template's variables).")
        # Most sends of a campaign carry no variables of their own: nothing to walk.
        problem = json_value_problem(context, max_depth=CONTEXT_DEPTH) if context else None
        if problem:
            raise RowError("context", problem)
        recipient = {
            "user_id": user,
            "address": address,
            "message_id": message_id,
            "context": context,
        }
        if time_zone is not None:
            # Kept only when given: most rows have none, and chunks stay small without it.
            if not isinstance(time_zone, str):
                raise RowError("time_zone", "An IANA time zone name, such as Europe/Paris.")
            try:
                zone(time_zone)
            except UnknownTimeZone as exc:
                raise RowError("time_zone", str(exc)) from None
            recipient["time_zone"] = time_zone
        if value is not None:
            # Kept only when given, as the zone: the job's value is every other row's.
            problem = value_problem(value)
            if problem:
                raise RowError("value", problem)
            recipient["value"] = float(value)
        elif self.value_required:
            raise RowError(
                "value",
                "The job is in a round and has no value of its own: this recipient needs one.",
            )
        return recipient


class SeenUsers:
    """The user ids a file has listed so far, in a roaring bitmap (64-bit ids in a 64-bit one)."""

    def __init__(self) -> None:
        self.ids: Any = BitMap() if max_user_id() < 2**32 else BitMap64()

    def first_time(self, user_id: int) -> bool:
        """True the first time a user id is seen (and remembers it)."""
        if user_id in self.ids:
            return False
        self.ids.add(user_id)
        return True


@dataclass
class Line:
    """One recipient line of a file: its number, and its recipient or what is wrong with it."""

    number: int
    recipient: dict[str, Any] | None
    error: RowError | None = None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is beyond the numbers JSON can carry")
    return value


def recipient_lines(
    raw: Any, rules: RecipientRules, *, first_line: int = 1, header: dict[str, int] | None = None
) -> Iterator[Line]:
    """Every recipient line of a campaign file (`raw`: its bytes, plain or gzip) in order,
    checked. Blank lines are skipped. Raises FileError for what makes the whole file unreadable:
    not UTF-8, a broken gzip, a bad header, a line the CSV reader cannot split.

    A part of a file (`raw` from a line after the first): `first_line` is the file's number of
    its first line, and `header` the columns the file's header line named (`file_header`; None:
    by position)."""
    rows: Any = None
    lines_before = first_line - 1
    try:
        binary = io.BufferedReader(_Binary(open_list(raw)), READ_BYTES)
        # Bytes that are not UTF-8 are kept as lone surrogates, to be named with their line.
        text = io.TextIOWrapper(binary, encoding="utf-8", errors="surrogateescape", newline="")
        rows = csv.reader(text, strict=True)
        at: dict[str, int] = {name: i for i, name in enumerate(POSITIONAL)}
        positional = True
        if header is not None:
            at, positional = header, False
        checked = False
        for row in rows:
            if not row or (len(row) == 1 and not row[0].strip()):
                continue  # a blank line
            # The line a record ends on (a quoted context may span several).
            number = rows.line_num + lines_before
            if not "".join(row).isascii():
                _utf8_checked(row, number)
            if number == 1 and _is_header(row):
                at, positional = _header(row), False
                continue
            if not checked:
                rules.columns_checked(at)
                checked = True
            yield _line(number, row, at, positional, rules)
    except csv.Error as exc:
        after = _after(rows)
        raise FileError(
            f"Not CSV: {exc}.", line=None if after is None else after + lines_before
        ) from None
    except (OSError, EOFError, ValueError) as exc:
        # A gzip cut short or corrupt (EOFError, BadGzipFile), a stream that broke.
        raise FileError(f"The file could not be read to its end: {exc}.") from None


def _is_header(row: list[str]) -> bool:
    """A file's first line is its header unless it starts with a user id."""
    first = row[0].strip()
    return not (first.isascii() and first.isdigit())


def file_header(first_line: bytes) -> dict[str, int] | None:
    """The columns a plain file's first line names (as `recipient_lines` reads them), or None
    when it is a recipient's line (columns by position). Raises FileError as reading would."""
    try:
        row = next(csv.reader([first_line.decode("utf-8", "surrogateescape")], strict=True), [])
    except csv.Error as exc:
        raise FileError(f"Not CSV: {exc}.", line=1) from None
    if not row or (len(row) == 1 and not row[0].strip()) or not _is_header(row):
        return None
    return _header(row)


def _utf8_checked(row: list[str], number: int) -> None:
    for cell in row:
        try:
            cell.encode("utf-8")
        except UnicodeEncodeError:
            raise FileError("The file is not UTF-8 text.", line=number) from None


def _after(rows: Any) -> int | None:
    return rows.line_num + 1 if rows is not None else None


def _line(
    number: int, row: list[str], at: dict[str, int], positional: bool, rules: RecipientRules
) -> Line:
    if positional and not 2 <= len(row) <= len(POSITIONAL):
        error = RowError("line", f"expected {FILE_FORMAT}; got {_fields(len(row))}.")
        return Line(number, None, error)
    if not positional and len(row) != len(at):
        names = ",".join(sorted(at, key=at.__getitem__))
        error = RowError("line", f"expected {names} (as the header says); got {_fields(len(row))}.")
        return Line(number, None, error)
    try:
        context = None
        if "context" in at and len(row) > at["context"]:
            cell = row[at["context"]].strip()
            if cell:
                try:
                    context = json.loads(cell, parse_constant=_no_constant, parse_float=_finite)
                except ValueError as exc:
                    raise RowError("context", f"Not JSON: {exc}.") from None
                if not isinstance(context, dict):
                    raise RowError("context", "Must be a JSON object (the template's variables).")
        zone_at = at.get("time_zone")
        zone_name = row[zone_at].strip() if zone_at is not None and len(row) > zone_at else ""
        value_at = at.get("value")
        value = value_from_cell(row[value_at]) if value_at is not None else None
        recipient = rules.recipient(
            row[at["user_id"]].strip(),
            row[at["address"]].strip(),
            context=context,
            time_zone=zone_name or None,
            value=value,
        )
    except RowError as exc:
        return Line(number, None, exc)
    return Line(number, recipient)


def _fields(n: int) -> str:
    return "1 field" if n == 1 else f"{n} fields"


def line_words(number: int, field: str, message: str) -> str:
    """A bad line in words: `line 3 (address): ...`, or `line 3: expected ...` when the line as
    a whole is at fault."""
    return (
        f"line {number:,}: {message}"
        if field == "line"
        else f"line {number:,} ({field}): {message}"
    )


def _header(row: list[str]) -> dict[str, int]:
    """The columns a header line names, by position; every name known, the required present."""
    names = [cell.strip().lower() for cell in row]
    unknown = [name for name in names if name not in COLUMNS]
    repeated = [name for name in names if names.count(name) > 1]
    missing = [name for name in REQUIRED if name not in names]
    if "message_id" in unknown:
        problem = (
            "a file's sends have the message id <campaign>:<user_id> (one per user); per-send "
            "message ids go in a JSON body's recipients"
        )
    elif unknown:
        problem = f"unknown column '{unknown[0][:40]}'"
    elif repeated:
        problem = f"the column {repeated[0]} is named twice"
    elif missing:
        problem = f"no {missing[0]} column"
    else:
        return {name: i for i, name in enumerate(names)}
    raise FileError(
        f"(the header) {problem}. Columns: {', '.join(COLUMNS)} (user_id and address required, "
        "in any order).",
        line=1,
    )


class _Binary(io.RawIOBase):
    """A plain `read(n)` stream as io.TextIOWrapper wants one (readinto, readable)."""

    def __init__(self, source: Any) -> None:
        self.source, self.left = source, b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.left or self.source.read(len(buffer))
        # A source may hand back more than asked for: the rest waits for the next call.
        data, self.left = data[: len(buffer)], data[len(buffer) :]
        buffer[: len(data)] = data
        return len(data)


CUT_SCAN_BYTES = 8 << 20  # read at a time when looking for where to cut a file


def file_cuts(raw: Any, size: int, part_bytes: int) -> list[tuple[int, int]]:
    """Where a plain campaign file (`raw`, a binary stream at its start) can be cut into parts
    of about `part_bytes`: for each part after the first, (the byte it starts at, the line it
    starts on), just after a line's end that is outside any quoted cell (a quoted context may
    span lines: the quotes before it are even). Empty when the file is not cut: smaller than two
    parts, or it ends a line with a bare carriage return (which the CSV reader counts as a line
    and this does not)."""
    cuts: list[tuple[int, int]] = []
    target, offset, lines, quotes = part_bytes, 0, 1, 0
    last = b""
    while target < size - part_bytes // 2:  # the last part at least half a part
        block = bytes(raw.read(CUT_SCAN_BYTES))
        if not block:
            break
        if (last + block).count(b"\r") != (last + block).count(b"\r\n") + block.endswith(b"\r"):
            return []
        last = block[-1:]
        at = max(0, target - offset)
        while at < len(block):
            end = block.find(b"\n", at)
            if end < 0:
                break
            if (quotes + block.count(b'"', 0, end)) % 2:
                at = end + 1  # inside a quoted cell: the next line end
                continue
            cut = offset + end + 1
            cuts.append((cut, lines + block.count(b"\n", 0, end + 1)))
            target = cut + part_bytes
            if target >= size - part_bytes // 2:
                break
            at = target - offset
        lines += block.count(b"\n")
        quotes += block.count(b'"')
        offset += len(block)
    return cuts


class FileRange:
    """The bytes [start, end) of a seekable binary stream, as a stream."""

    def __init__(self, raw: Any, start: int, end: int) -> None:
        raw.seek(start)
        self.raw, self.left = raw, end - start

    def read(self, n: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        data = bytes(self.raw.read(self.left if n < 0 else min(n, self.left)))
        self.left -= len(data)
        return data
