"""A file of people's preferences imported over HTTP and by the command: JSON lines and CSV, text
or gzip; checked whole first (a bad line or a person twice refuses it, naming the lines, and
nothing is written); written in batches, each change journaled with source import; the same
file again changes nothing."""

import gzip
import io
import json
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import CommandError, call_command

from limits.models.people import Preference, PreferenceChange
from limits.models.policy import Topic
from limits.people import preferences_import as service
from limits.people.preferences import preference_cache, preferences_read
from limits.people.preferences_import import PreferencesFileTooLarge, preferences_import
from limits.policy.selectors import topics_read
from limits.reasons import Reason
from tests.support.api import call

pytestmark = pytest.mark.django_db(transaction=True)

PATH = "/api/v1/preferences/import/"
JSONL = {"Content-Type": "application/x-ndjson"}
CSV = {"Content-Type": "text/csv"}
LATER = (datetime.now(tz=UTC) + timedelta(days=7)).replace(microsecond=0)
LATER_TEXT = LATER.isoformat().replace("+00:00", "Z")


@pytest.fixture
def topics(transactional_db):
    Topic.objects.create(slug="news", name="News", channels=["email", "push"])
    Topic.objects.create(slug="terms", name="Terms", default="required")
    Topic.objects.create(slug="offers", name="Offers", default="unsubscribed")


def lines(*people: dict) -> bytes:
    return b"".join(json.dumps(person).encode() + b"\n" for person in people)


def said(user_id: int) -> dict:
    """A person's preferences as they stand (empty: they said nothing)."""
    prefs = preferences_read(user_id, topics=topics_read())
    return {
        "topics": prefs.topics,
        "channels": prefs.channels,
        "paused_until": prefs.paused_until,
        "paused_channels": prefs.paused_channels,
        "frequency": prefs.frequency,
    }


def journal() -> list[tuple[int, str, str | None]]:
    return list(
        PreferenceChange.objects.order_by("id").values_list(
            "user_id", "source", "changed_by__username"
        )
    )


@pytest.mark.postgres
def test_a_json_lines_file_replaces_the_preferences_of_each_person_in_it(api, topics):
    gate = api("gate")
    before = {"topics": {"news": {"push": False}}, "channels": {"sms": False}}
    assert call(gate, "PUT", "/api/v1/users/7/preferences/", json=before).status_code == 200
    assert call(gate, "PUT", "/api/v1/users/9/preferences/", json=before).status_code == 200
    week = {"channel": "email", "window": {"kind": "rolling", "seconds": 604_800}, "limit": 2}
    body = lines(
        {"user_id": 7, "topics": {"news": {"email": False}}, "paused_until": LATER_TEXT},
        {"user_id": "8", "channels": {"push": False}, "paused_channels": {"sms": LATER_TEXT},
         "topics": {"offers": {"email": True}}, "frequency": [week]},
    ) + b"\n"  # fmt: skip

    answer = call(gate, "PUT", PATH, data=body, headers=JSONL)

    assert answer.status_code == 200, answer.text
    assert answer.json() == {"lines": 3, "people": 2, "changed": 2, "unchanged": 0}
    # Whole: user 7's earlier choices are gone; user 9, not in the file, keeps theirs.
    assert said(7) == {"topics": {"news": {"email": False}}, "channels": {},
                       "paused_until": LATER, "paused_channels": {}, "frequency": []}  # fmt: skip
    assert said(8)["paused_channels"] == {"sms": LATER}
    assert said(8)["frequency"] == [week]
    assert said(9)["channels"] == {"sms": False}
    assert journal()[-2:] == [(7, "import", "gate"), (8, "import", "gate")]
    imported = PreferenceChange.objects.get(user_id=7, source="import")
    assert imported.before is not None and imported.before["channels"] == {"sms": False}


@pytest.mark.postgres
def test_a_csv_file_has_one_choice_a_row_and_a_persons_rows_together(api, topics):
    body = (
        "\ufeffuser_id,topic,channel,subscribed,paused_until\r\n"
        "5,news,email,false,\r\n"
        "5,offers,push,TRUE,\r\n"
        "5,,sms,no,\r\n"
        '5,,push,,"' + LATER_TEXT + '"\r\n'
        "6,,,," + LATER_TEXT + "\r\n"
        "\r\n"
        "11,,,,\r\n"  # a person saying nothing: back to the defaults
    ).encode()
    Preference.objects.create(user_id=11, channels={"email": False})

    answer = call(api("gate"), "PUT", PATH, data=body, headers=CSV)

    assert answer.status_code == 200, answer.text
    assert answer.json() == {"lines": 8, "people": 3, "changed": 3, "unchanged": 0}
    assert said(5) == {
        "topics": {"news": {"email": False}, "offers": {"push": True}},
        "channels": {"sms": False},
        "paused_until": None,
        "paused_channels": {"push": LATER},
        "frequency": [],
    }
    assert said(6)["paused_until"] == LATER
    assert not Preference.objects.filter(user_id=11).exists()


@pytest.mark.postgres
def test_a_gzip_file_is_told_by_its_bytes_and_the_format_by_the_query(api, topics):
    body = gzip.compress(b"user_id,channel,subscribed\n3,email,0\n4,push,1\n")
    answer = call(
        api("gate"), "PUT", PATH + "?format=csv", data=body,
        headers={"Content-Type": "application/gzip"},
    )  # fmt: skip
    assert answer.status_code == 200, answer.text
    assert answer.json()["people"] == 2
    assert said(3)["channels"] == {"email": False}
    assert said(4)["channels"] == {"push": True}
    # The gate in this process decides by them at once.
    refused = preference_cache().refusals("email", None, [3, 4], now_ms=0)
    assert refused is not None and refused[0] is not None and refused[0][0] == Reason.PREFERENCE
    assert refused[1] is None


def test_a_file_whose_format_is_not_said_is_refused(api, topics):
    gate = api("gate")
    unsaid = call(gate, "PUT", PATH, data=b"user_id\n1\n", headers={"Content-Type": "text/plain"})
    assert unsaid.status_code == 400
    assert "?format=" in unsaid.json()["file"][0]
    wrong = call(gate, "PUT", PATH + "?format=xml", data=b"user_id\n1\n")
    assert wrong.status_code == 400
    assert wrong.json()["file"] == ["No format 'xml': csv or jsonl."]
    assert call(gate, "PUT", PATH + "?format=csv").status_code == 400  # no body
    assert Preference.objects.count() == 0


def test_bad_lines_refuse_the_file_naming_each_and_nothing_is_written(api, topics):
    body = (
        lines(
            {"user_id": 1, "topics": {"news": {"email": False}}},
            {"user_id": 2, "topics": {"news": {"sms": False}}},
            {"user_id": 3, "colour": "red"},
            {"user_id": 4, "topics": {"terms": {"email": False}}},
        )
        + b'{"user_id": 5,\n'
        + lines({"user_id": -6})
    )

    answer = call(api("gate"), "PUT", PATH, data=body, headers=JSONL)

    assert answer.status_code == 400
    found = answer.json()
    assert found["line"] == 2
    assert [(p["line"], p["field"]) for p in found["problems"]] == [
        (2, "topics.news.sms"), (3, "colour"), (4, "topics.terms.email"), (5, ""),
        (6, "user_id"),
    ]  # fmt: skip
    assert found["file"][0].startswith("line 2: topics.news.sms: Topic 'news' is not sent on sms")
    assert Preference.objects.count() == 0
    assert PreferenceChange.objects.count() == 0


def test_bad_csv_rows_are_named_by_their_own_line(api, topics):
    body = (
        b"user_id,topic,channel,subscribed,paused_until\n"
        b"1,news,email,false,\n"
        b"1,news,sms,false,\n"  # not sent on sms: named on this row, not the person's first
        b"2,news,email,maybe,\n"
        b"3,news,,true,\n"
        b"4,,email,,yesterday\n"
        b"x,,email,true,\n"
        b"5,,email,true\n"
    )
    answer = call(api("gate"), "PUT", PATH, data=body, headers=CSV)
    assert answer.status_code == 400
    assert [(p["line"], p["field"]) for p in answer.json()["problems"]] == [
        (3, "topics.news.sms"), (4, "subscribed"), (5, ""), (6, "paused_until"), (7, "user_id"),
        (8, ""),
    ]  # fmt: skip
    unknown = call(api("gate"), "PUT", PATH, data=b"user_id,colour\n1,red\n", headers=CSV)
    assert unknown.status_code == 400
    assert unknown.json()["line"] == 1
    assert "Unknown column 'colour'" in unknown.json()["file"][0]
    assert Preference.objects.count() == 0


def test_a_person_named_twice_is_refused_naming_both_lines(api, topics):
    gate = api("gate")
    twice = lines({"user_id": 1}, {"user_id": 2}, {"user_id": 1, "channels": {"sms": False}})
    answer = call(gate, "PUT", PATH, data=twice, headers=JSONL)
    assert answer.status_code == 400
    assert answer.json()["file"] == [
        "line 3: user_id: User 1 is on line 1 too: a person once a file, all their preferences "
        "on one line."
    ]
    apart = b"user_id,channel,subscribed\n1,sms,false\n2,sms,false\n1,push,false\n"
    answer = call(gate, "PUT", PATH, data=apart, headers=CSV)
    assert answer.status_code == 400
    assert answer.json()["problems"] == [
        {
            "line": 4,
            "field": "user_id",
            "message": "User 1 is on line 2 too: a person's rows "
            "follow one another (sort the file by user_id).",
        }
    ]
    same_choice = b"user_id,channel,subscribed\n1,sms,false\n1,sms,true\n"
    answer = call(gate, "PUT", PATH, data=same_choice, headers=CSV)
    assert answer.json()["problems"][0]["line"] == 3
    assert answer.json()["problems"][0]["field"] == "channels.sms"
    assert Preference.objects.count() == 0


def test_the_problems_named_stop_at_twenty(api, topics):
    body = lines(*({"user_id": n, "channels": {"fax": False}} for n in range(50)))
    answer = call(api("gate"), "PUT", PATH, data=body, headers=JSONL)
    assert answer.status_code == 400
    assert len(answer.json()["problems"]) == 20
    assert answer.json()["file"][-1] == "The check stopped at the first 20 problems."


def test_an_upload_larger_than_the_import_takes_is_refused_before_it_is_read(
    api, topics, monkeypatch
):
    monkeypatch.setattr(service, "MAX_UPLOAD_BYTES", 1000)
    answer = call(api("gate"), "PUT", PATH, data=b"user_id\n" + b"1\n" * 600, headers=CSV)
    assert answer.status_code == 413
    assert "1,000 bytes" in answer.json()["detail"]


def test_a_body_without_a_length_is_counted_as_it_is_read(topics, monkeypatch):
    def stream(data: bytes) -> io.BufferedReader:
        """As a request's body: read once, never sought."""
        raw = io.BytesIO(data)
        raw.seekable = lambda: False  # type: ignore[method-assign]
        return io.BufferedReader(raw)

    monkeypatch.setattr(service, "MAX_UPLOAD_BYTES", 1000)
    with pytest.raises(PreferencesFileTooLarge):
        preferences_import(fileobj=stream(b"user_id\n" + b"1\n" * 600), file_format="csv")
    small = preferences_import(
        fileobj=stream(b"user_id,channel,subscribed\n1,sms,0\n"), file_format="csv"
    )
    assert (small.people, small.changed) == (1, 1)


def test_a_gzip_that_inflates_past_the_limit_is_refused(api, topics, monkeypatch):
    monkeypatch.setattr(service, "MAX_BYTES", 2**20)
    bomb = gzip.compress(b" \n" * (4 * 2**20))  # blank lines, 8 MiB
    assert len(bomb) < 20_000
    answer = call(api("gate"), "PUT", PATH + "?format=jsonl", data=bomb)
    assert answer.status_code == 400
    assert answer.json()["file"] == [
        "The file is larger than 1,048,576 bytes once decompressed, the most a file of "
        "preferences may be."
    ]
    monkeypatch.setattr(service, "MAX_LINES", 3)
    many = call(api("gate"), "PUT", PATH, data=lines(*({"user_id": n} for n in range(5))),
                headers=JSONL)  # fmt: skip
    assert many.status_code == 400
    assert many.json()["line"] == 4


@pytest.mark.postgres
def test_the_same_file_again_changes_nothing_and_journals_nothing(api, topics):
    gate = api("gate")
    body = lines(*({"user_id": n, "topics": {"news": {"email": n % 2 == 0}}} for n in range(10)))
    first = call(gate, "PUT", PATH, data=body, headers=JSONL)
    assert first.json() == {"lines": 10, "people": 10, "changed": 10, "unchanged": 0}
    again = call(gate, "PUT", PATH, data=body, headers=JSONL)
    assert again.json() == {"lines": 10, "people": 10, "changed": 0, "unchanged": 10}
    assert PreferenceChange.objects.filter(source="import").count() == 10


def test_importing_needs_the_right_to_change_preferences(api, topics):
    body = lines({"user_id": 1, "channels": {"sms": False}})
    assert call(api("viewer"), "PUT", PATH, data=body, headers=JSONL).status_code == 403
    assert call(api("anonymous"), "PUT", PATH, data=body, headers=JSONL).status_code == 401
    assert Preference.objects.count() == 0


def test_a_crash_leaves_the_batches_committed_and_the_same_file_writes_the_rest(
    topics, monkeypatch
):
    monkeypatch.setattr(service, "BATCH", 2)
    body = lines(*({"user_id": n, "channels": {"sms": False}} for n in range(5)))
    real, calls = service.preferences_store, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("the database went away")
        return real(*args, **kwargs)

    monkeypatch.setattr(service, "preferences_store", failing)
    with pytest.raises(RuntimeError):
        preferences_import(fileobj=io.BytesIO(body), file_format="jsonl")
    assert sorted(Preference.objects.values_list("user_id", flat=True)) == [0, 1]

    monkeypatch.setattr(service, "preferences_store", real)
    again = preferences_import(fileobj=io.BytesIO(body), file_format="jsonl")
    assert (again.people, again.changed, again.unchanged) == (5, 3, 2)
    assert PreferenceChange.objects.filter(source="import").count() == 5


def test_the_command_imports_a_file_on_disk_and_says_how_far_it_got(topics, tmp_path, monkeypatch):
    monkeypatch.setattr(service, "BATCH", 2)
    path = tmp_path / "preferences.jsonl.gz"
    path.write_bytes(
        gzip.compress(lines(*({"user_id": n, "channels": {"push": False}} for n in range(5))))
    )
    out = io.StringIO()
    call_command("import_preferences", str(path), "--every", "2", stdout=out)
    printed = out.getvalue().splitlines()
    assert printed[:4] == [
        "Checked 2 lines.", "Checked 4 lines.", "Written 2 people.", "Written 4 people."
    ]  # fmt: skip
    assert printed[-1].startswith("Imported 5 people from 5 lines: 5 changed, 0 unchanged, in ")
    assert journal() == [(n, "import", None) for n in range(5)]

    bad = tmp_path / "bad.csv"
    bad.write_text("user_id,channel,subscribed\n1,fax,false\n")
    with pytest.raises(CommandError, match=r"line 2: channels\.fax: Unknown channel 'fax'"):
        call_command("import_preferences", str(bad), stdout=io.StringIO())
    with pytest.raises(CommandError, match="Say the file's format"):
        call_command("import_preferences", str(tmp_path / "notes.txt"), stdout=io.StringIO())
    assert Preference.objects.count() == 5
