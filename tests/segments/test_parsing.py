import gzip
import io

import numpy as np
import pytest

from segments import parsing
from segments.parsing import ListSummary, UserListError, iter_ids


def parse(data: bytes, **kwargs) -> list[int]:
    return [int(x) for chunk in iter_ids(io.BytesIO(data), **kwargs) for x in chunk]


def error_of(data: bytes) -> str:
    with pytest.raises(UserListError) as caught:
        parse(data)
    return caught.value.messages[0]


def test_it_reads_one_id_a_line_with_blank_lines_and_duplicates():
    assert parse(b"5\n\n7\n5\n4294967295\n0") == [5, 7, 5, 4294967295, 0]


def test_it_skips_a_header_on_the_first_line_only():
    assert parse(b"user_id\n1\n2\n") == [1, 2]
    assert error_of(b"1\nuser_id\n") == (
        "line 2: 'user_id' is not a user id (unsigned 32-bit integer expected)"
    )


def test_it_accepts_windows_line_ends():
    assert parse(b"user_id\r\n1\r\n2\r\n") == [1, 2]


def test_it_reads_gzip_whatever_the_file_name():
    assert parse(gzip.compress(b"id\n3\n4\n")) == [3, 4]


@pytest.mark.parametrize(
    ("body", "line", "shown"),
    [
        (b"1\n2\nabc\n", 3, "abc"),
        (b"1\n-5\n", 2, "-5"),
        (b"1\n4294967296\n", 2, "4294967296"),
        (b"1\n99999999999999999999999\n", 2, "99999999999999999999999"),
        (b"7\n1,2\n", 2, "1,2"),
        (b"7\n 8\n", 2, " 8"),
        (b"7\n8 \n", 2, "8 "),
        (b"7\n\n\n1.5\n", 4, "1.5"),
    ],
)
def test_a_bad_line_is_reported_with_its_number(body: bytes, line: int, shown: str):
    message = error_of(body)
    assert message == f"line {line}: '{shown}' is not a user id (unsigned 32-bit integer expected)"


def test_line_numbers_are_exact_across_chunk_boundaries(monkeypatch):
    monkeypatch.setattr(parsing, "CHUNK_BYTES", 7)
    body = b"".join(f"{i}\n".encode() for i in range(1000)) + b"oops\n"
    assert error_of(body).startswith("line 1001: 'oops'")
    assert parse(b"".join(f"{i}\n".encode() for i in range(1000))) == list(range(1000))


def test_line_numbers_count_the_header_and_gzip(monkeypatch):
    monkeypatch.setattr(parsing, "CHUNK_BYTES", 5)
    assert error_of(gzip.compress(b"user_id\n1\n2\nx\n")).startswith("line 4: 'x'")


def test_the_summary_counts_lines_ids_and_bytes():
    summary = ListSummary()
    parse(b"id\n1\n\n2\n", summary=summary)
    assert (summary.lines, summary.ids, summary.bytes) == (4, 2, 8)


def test_a_large_list_parses_in_chunks_without_losing_ids(monkeypatch):
    monkeypatch.setattr(parsing, "CHUNK_BYTES", 1 << 16)
    ids = np.random.default_rng(3).integers(0, 2**32, 50_000, dtype=np.uint64)
    body = ("\n".join(map(str, ids.tolist())) + "\n").encode()
    chunks = list(iter_ids(io.BytesIO(body)))
    assert len(chunks) > 1
    assert np.array_equal(np.concatenate(chunks), ids.astype(np.uint32))


def test_a_corrupt_gzip_file_is_a_clear_error():
    data = bytearray(gzip.compress(b"1\n2\n3\n" * 1000))
    data[20:40] = b"\xff" * 20  # damage the deflate stream
    assert error_of(bytes(data)).startswith("The file could not be read")


def test_a_line_without_end_is_refused_before_it_fills_memory(monkeypatch):
    from segments import parsing

    monkeypatch.setattr(parsing, "MAX_LINE_BYTES", 10)
    assert error_of(b"1\n2\n" + b"3" * 50) == (
        "line 3: longer than 10 bytes without a line break; one user id a line"
    )
