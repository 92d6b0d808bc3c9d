"""User-list files: one user id a line, streamed in chunks and parsed with numpy.

A file may be gzip-compressed (recognised by its magic bytes, whatever its name), may start with
one header line (`user_id`, say), and may hold blank lines, Windows line ends and duplicates.
Anything else (a negative number, a second field, a stray character, an id too large) stops the
parse with the line number and the line, before anything is stored.

Validation and parsing are vectorised: each chunk is checked byte-wise (digits and line ends
only), then converted by numpy's C parser, so a file is never held whole in memory and a line
is never a Python object. Memory is bounded by the chunk: about 26 MiB at worst (1 MiB of
two-byte lines, each costing a few numpy words), whatever the size of the file or how far a
gzip inflates; the caller's bitmap of distinct ids comes on top.
"""

import gzip
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from django.core.exceptions import ValidationError

# 1 MiB: as fast as larger chunks (it stays in cache) and a quarter of the memory of 4 MiB.
CHUNK_BYTES = 1 * 1024 * 1024
GZIP_MAGIC = b"\x1f\x8b"
HEADER = re.compile(rb"^[A-Za-z_][A-Za-z0-9_ ]*\r?$")
MAX_ID = {32: 2**32 - 1, 64: 2**64 - 1}
# Digits a valid id may have (leading zeros included); more cannot fit and would overflow.
MAX_DIGITS = {32: 10, 64: 20}


class UserListError(ValidationError):
    """A user list that cannot be used; the message names the line. It carries its problem
    (gatekeeper.lib.problems): the REST API answers it as the 400 `{"file": [...], "line"}`."""

    def __init__(self, message: str, *, line: int | None = None) -> None:
        super().__init__(message, code="user_list")
        self.line = line

    def field_errors(self) -> dict[str, Any]:
        return {"file": self.messages, "line": self.line}


class ParseStopped(Exception):
    """The caller's budget (`stop_after_bytes`) is spent before the end of the file: not an
    error; the caller validates the rest elsewhere (the web process hands it to Celery)."""


@dataclass
class ListSummary:
    lines: int = 0  # every line read, header and blank lines included
    ids: int = 0  # lines holding an id (repeats included)
    bytes: int = 0  # bytes read, decompressed
    header: int = 0  # 1 when line 1 was a header


class _Prefixed:
    """A stream with its first bytes already read (to look for the gzip magic) put back."""

    def __init__(self, head: bytes, rest: Any) -> None:
        self.head, self.rest = head, rest

    def read(self, n: int = -1) -> bytes:
        if not self.head:
            return bytes(self.rest.read(n))
        if n is None or n < 0:
            data, self.head = self.head + self.rest.read(), b""
            return data
        data, self.head = self.head[:n], self.head[n:]
        if len(data) < n:
            data += self.rest.read(n - len(data))
        return data


def open_list(fileobj: Any) -> Any:
    """A readable stream of the file's bytes, decompressed if it is gzip."""
    head = fileobj.read(2)
    stream = _Prefixed(head, fileobj)
    if head == GZIP_MAGIC:
        return gzip.GzipFile(fileobj=stream, mode="rb")  # type: ignore[call-overload]
    return stream


def _describe(line: bytes, width: int) -> str:
    text = line.rstrip(b"\r").decode("utf-8", errors="replace")
    shown = text if len(text) <= 40 else text[:37] + "..."
    return f"'{shown}' is not a user id (unsigned {width}-bit integer expected)"


def _line_at(data: bytes, offset: int) -> tuple[int, bytes]:
    """(index of the line within data, the line's bytes) for the byte at offset."""
    start = data.rfind(b"\n", 0, offset) + 1
    end = data.find(b"\n", offset)
    return data.count(b"\n", 0, start), data[start : end if end >= 0 else len(data)]


def _parse_block(data: bytes, first_line: int, width: int) -> np.ndarray:
    """Ids in `data` (whole lines, ending with a newline). Raises UserListError."""
    raw = np.frombuffer(data, dtype=np.uint8)
    newline = raw == 10
    digit = (raw >= 48) & (raw <= 57)
    ok = digit | newline | (raw == 13)
    if not ok.all():
        bad = int(np.argmin(ok))
        index, line = _line_at(data, bad)
        raise UserListError(
            f"line {first_line + index}: {_describe(line, width)}", line=first_line + index
        )
    carriage = np.flatnonzero(raw == 13)
    if carriage.size and not newline[carriage + 1].all():
        bad = int(carriage[np.argmin(newline[carriage + 1])])
        index, line = _line_at(data, bad)
        raise UserListError(
            f"line {first_line + index}: {_describe(line, width)}", line=first_line + index
        )
    ends = np.flatnonzero(newline)
    starts = np.concatenate(([0], ends[:-1] + 1))
    lengths = ends - starts - (raw[np.maximum(ends - 1, 0)] == 13)
    too_long = lengths > MAX_DIGITS[width]
    if too_long.any():
        index = int(np.argmax(too_long))
        line = data[starts[index] : ends[index]]
        raise UserListError(
            f"line {first_line + index}: {_describe(line, width)}", line=first_line + index
        )
    # Only digits and line ends remain, so numpy's C parser reads them all; blank lines and
    # carriage returns count as separating whitespace.
    ids = np.fromstring(data, dtype=np.uint64, sep=" ") if data.strip() else np.empty(0, np.uint64)
    if width == 32 and ids.size and int(ids.max()) > MAX_ID[32]:
        position = int(np.argmax(ids > MAX_ID[32]))
        index = int(np.flatnonzero(lengths > 0)[position])
        line = data[starts[index] : ends[index]]
        raise UserListError(
            f"line {first_line + index}: {_describe(line, width)}", line=first_line + index
        )
    return ids.astype(np.uint32) if width == 32 else ids


NEWLINE = b"\n"
MAX_LINE_BYTES = (
    1 << 20
)  # a user id is at most 20 digits; a megabyte without a newline is not a list


def iter_ids(
    fileobj: Any,
    *,
    width: int = 32,
    summary: ListSummary | None = None,
    max_bytes: int | None = None,
    max_lines: int | None = None,
    stop_after_bytes: int | None = None,
) -> Iterator[np.ndarray]:
    """Yield the ids of a user-list file as numpy arrays, chunk by chunk.

    Raises UserListError naming the first bad line, or saying which limit the file goes past:
    `max_bytes` (decompressed) and `max_lines`. Raises ParseStopped once more than
    `stop_after_bytes` were read. `summary`, when given, is filled in as the file is read.
    """
    if width not in MAX_ID:
        raise ValueError(f"id width must be 32 or 64, not {width}")
    summary = summary if summary is not None else ListSummary()
    try:
        stream = open_list(fileobj)
    except (OSError, EOFError, zlib.error) as exc:  # a client that went away mid-upload, say
        raise UserListError(f"The file could not be read: {exc}") from exc
    carry = b""
    line_no = 1
    first = True
    while True:
        try:
            chunk = stream.read(CHUNK_BYTES)
        except (OSError, EOFError, zlib.error) as exc:
            raise UserListError(f"The file could not be read: {exc}") from exc
        summary.bytes += len(chunk)
        if max_bytes is not None and summary.bytes > max_bytes:
            inflated = " once decompressed" if isinstance(stream, gzip.GzipFile) else ""
            raise UserListError(
                f"The list is larger than {max_bytes:,} bytes{inflated}, the most a list may be "
                "(GATEKEEPER_USER_LIST_MAX_BYTES)"
            )
        if stop_after_bytes is not None and summary.bytes > stop_after_bytes:
            raise ParseStopped
        if not chunk:
            data, carry = carry, b""
            if data and not data.endswith(b"\n"):
                data += b"\n"
        else:
            buffer = carry + chunk
            cut = buffer.rfind(b"\n") + 1
            data, carry = buffer[:cut], buffer[cut:]
            if len(carry) > MAX_LINE_BYTES:
                long_line = line_no + data.count(NEWLINE)
                raise UserListError(
                    f"line {long_line}: longer than {MAX_LINE_BYTES:,} bytes without a line "
                    "break; one user id a line"
                )
        if first and data:
            first = False
            header_end = data.find(b"\n")
            if HEADER.match(data[:header_end]):
                data = data[header_end + 1 :]
                line_no += 1
                summary.lines += 1
                summary.header = 1
        if data:
            lines = data.count(b"\n")
            if max_lines is not None and summary.lines + lines > max_lines:
                raise UserListError(
                    f"The list has more than {max_lines:,} lines, the most a list may have "
                    "(GATEKEEPER_USER_LIST_MAX_LINES)",
                    line=max_lines + 1,
                )
            ids = _parse_block(data, line_no, width)
            line_no += lines
            summary.lines += lines
            summary.ids += int(ids.size)
            if ids.size:
                yield ids
        if not chunk:
            return
