"""Classes of bad input, on every endpoint that takes them, through a live server: strings that
cannot be encoded, NUL characters, deep nesting, bodies above the limit. Each gets a 400 (or a
413) that names the field, never a 500, and nothing is stored."""

import json

import pytest

from segments.models import Segment
from tests.support.api import call
from worker.models import SendJob

pytestmark = pytest.mark.django_db(transaction=True)

LONE = "\ud800"  # valid JSON ("\ud800"), but no UTF-8 encoding exists for it

RELEASE = {"channel": "email", "requests": [{"user_id": 1, "message_id": "m"}]}
GATE = {**RELEASE, "campaign": "c"}
SEND = {
    "channel": "email",
    "campaign": "c",
    "template": "welcome",
    "recipients": [{"user_id": 1, "address": "a@example.com", "context": {"name": "A"}}],
}
# (role, method, path, a good body, the string fields to spoil: path into the body, field name)
STRING_FIELDS = [
    ("gate", "POST", "/api/v1/gate/check/", GATE, ["channel", "campaign", "category"]),
    ("gate", "POST", "/api/v1/gate/check/", GATE, ["requests.0.message_id"]),
    ("gate", "POST", "/api/v1/gate/check/", GATE, ["requests.0.user_id"]),
    ("gate", "POST", "/api/v1/gate/release/", RELEASE, ["channel", "requests.0.message_id"]),
    (
        "gate",
        "POST",
        "/api/v1/sends/",
        SEND,
        ["channel", "campaign", "template", "category", "on_capped", "on_invalid"],
    ),
    (
        "gate",
        "POST",
        "/api/v1/sends/",
        SEND,
        [
            "recipients.0.address",
            "recipients.0.message_id",
            "recipients.0.user_id",
            "recipients.0.context.name",
        ],
    ),
    (
        "marketer",
        "POST",
        "/api/v1/segments/",
        {"slug": "s", "name": "S", "priority": 50},
        ["slug", "name", "description"],
    ),
    ("marketer", "PATCH", "/api/v1/segments/vip/", {}, ["name", "description"]),
    ("viewer", "POST", "/api/v1/segments/lookup/", {"user_ids": [1]}, ["user_ids.0"]),
]
CASES = [
    pytest.param(role, method, path, body, field, id=f"{method} {path} {field}")
    for role, method, path, body, fields in STRING_FIELDS
    for field in fields
]


def spoiled(body: dict, field: str, value: object) -> dict:
    copy = json.loads(json.dumps(body))
    *parents, last = field.split(".")
    target = copy
    for part in parents:
        target = target[int(part)] if part.isdigit() else target[part]
    target[int(last) if last.isdigit() else last] = value
    return copy


def named(field: str) -> str:
    """`requests.0.message_id` as the API names it: `requests[0].message_id`."""
    parts = field.split(".")
    out = parts[0]
    for part in parts[1:]:
        out += f"[{part}]" if part.isdigit() else f".{part}"
    return out


@pytest.mark.parametrize(("role", "method", "path", "body", "field"), CASES)
def test_a_lone_surrogate_in_any_string_field_is_a_400_naming_it(
    api, snapshot, role, method, path, body, field
):
    response = call(api(role), method, path, json=spoiled(body, field, f"x{LONE}"))
    assert response.status_code == 400, response.text
    assert named(field) in response.json(), response.json()
    assert "surrogate" in str(response.json())


@pytest.mark.parametrize(("role", "method", "path", "body", "field"), CASES)
def test_a_nul_character_in_any_string_field_is_a_400_naming_it(
    api, snapshot, role, method, path, body, field
):
    response = call(api(role), method, path, json=spoiled(body, field, "x\x00y"))
    assert response.status_code == 400, response.text
    assert named(field) in response.json(), response.json()


def test_surrogate_pairs_are_ordinary_text(api, snapshot):
    body = spoiled(GATE, "requests.0.message_id", "emoji-\U0001f600")
    response = call(api("gate"), "POST", "/api/v1/gate/check/", json=body)
    assert response.status_code == 200
    assert response.json()["results"][0]["message_id"] == "emoji-\U0001f600"


JSON_ENDPOINTS = [
    ("gate", "POST", "/api/v1/gate/check/"),
    ("gate", "POST", "/api/v1/gate/release/"),
    ("gate", "POST", "/api/v1/sends/"),
    ("marketer", "POST", "/api/v1/segments/"),
    ("marketer", "PATCH", "/api/v1/segments/vip/"),
    ("marketer", "PUT", "/api/v1/limits/vip/email/"),
    ("viewer", "POST", "/api/v1/segments/lookup/"),
]


@pytest.mark.parametrize(("role", "method", "path"), JSON_ENDPOINTS)
def test_a_body_nested_thousands_deep_is_a_400_on_every_json_endpoint(
    api, snapshot, role, method, path
):
    session = api(role)
    for body in ("[" * 5000 + "]" * 5000, '{"a":' * 5000 + "1" + "}" * 5000):
        response = call(
            session, method, path, data=body, headers={"Content-Type": "application/json"}
        )
        assert response.status_code == 400, response.text
        assert "non_field_errors" in response.json() or "a" in response.json()


def test_a_deep_context_is_refused_naming_it_and_the_limit_is_stated(api, snapshot):
    s = api("gate")
    for depth in (40, 5000):
        deep = "1"
        for _ in range(depth):
            deep = '{"a":' + deep + "}"
        body = json.dumps(SEND).replace('{"name": "A"}', deep)
        response = call(
            s, "POST", "/api/v1/sends/", data=body, headers={"Content-Type": "application/json"}
        )
        assert response.status_code == 400, response.text
        errors = response.json()
        assert "32 levels" in str(errors)
        if depth == 40:  # within what a parser walks: the field is named
            assert "recipients[0].context" in errors
    # Within the body's limit but deeper than a template context may be (16 levels).
    context: dict = {}
    for _ in range(20):
        context = {"a": context}
    refused = spoiled(SEND, "recipients.0.context", context)
    response = call(s, "POST", "/api/v1/sends/", json=refused)
    assert (
        response.status_code == 400 and "16 levels" in response.json()["recipients[0].context"][0]
    )
    assert not SendJob.objects.exists()


@pytest.mark.parametrize(
    ("role", "method", "path", "limit"),
    [
        ("gate", "POST", "/api/v1/gate/check/", 16 * 2**20),
        ("gate", "POST", "/api/v1/gate/release/", 16 * 2**20),
        ("gate", "POST", "/api/v1/sends/", 64 * 2**20),
        ("viewer", "POST", "/api/v1/segments/lookup/", 4 * 2**20),
        ("marketer", "POST", "/api/v1/segments/", 2**20),
        ("marketer", "PATCH", "/api/v1/segments/vip/", 2**20),
        ("marketer", "PUT", "/api/v1/limits/vip/email/", 2**20),
    ],
)
def test_a_body_above_the_endpoints_limit_is_a_json_413_that_states_it(
    api, snapshot, role, method, path, limit
):
    body = b'{"x": "' + b"a" * (limit - 8) + b'"}'
    assert len(body) == limit + 1
    response = call(
        api(role), method, path, data=body, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 413
    assert f"at most {limit:,} bytes" in response.json()["detail"]


def test_a_100000_recipient_job_is_taken_and_finishes(api, snapshot, settings):
    from worker.chunks import send_chunk_run
    from worker.models import SendChunk

    settings.GATEKEEPER_DISPATCHERS = {"push": "null"}
    recipients = [
        {"user_id": u, "address": f"fcm-token-{u:012d}-abcdefghijklmnop", "context": {"n": u}}
        for u in range(100_000)
    ]
    body = {"channel": "push", "campaign": "big", "template": "welcome", "recipients": recipients}
    assert len(json.dumps(body)) > 2.5 * 2**20  # above Django's default body limit
    response = call(api("gate"), "POST", "/api/v1/sends/", json=body)
    assert response.status_code == 202, response.text[:300]
    for chunk_id in SendChunk.objects.order_by("pk").values_list("pk", flat=True):
        send_chunk_run(chunk_id=chunk_id)  # as the worker would, from the broker
    job = SendJob.objects.get()
    assert job.status == "done" and job.total == 100_000
    assert job.sent + job.capped == job.total and job.pending == 0
    followed = call(api("gate"), "GET", f"/api/v1/sends/{job.pk}/").json()
    assert followed["pending"] == 0 and followed["sent"] == job.sent


def test_nothing_is_stored_by_a_refused_segment_body(api, snapshot):
    before = list(Segment.objects.values_list("slug", "name", "priority"))
    m = api("marketer")
    for body in (
        {"slug": "x", "name": "X", "priority": 5, "colour": "red"},  # an unknown field
        {"slug": "x", "name": "  ", "priority": 5},  # a blank name
        {"slug": 0, "name": "X", "priority": 5},  # a number where a string belongs
        {"slug": "x", "name": 7, "priority": 5},
        {"slug": "x", "name": "X", "priority": 2**63 - 2},  # beyond the column
    ):
        response = call(m, "POST", "/api/v1/segments/", json=body)
        assert response.status_code == 400, (body, response.text)
    # A slug never changes: PATCH does not take one.
    renamed = call(m, "PATCH", "/api/v1/segments/default/", json={"slug": "everyone"})
    assert renamed.status_code == 400 and "slug" in renamed.json()
    same = call(m, "PATCH", "/api/v1/segments/vip/", json={"name": "VIPs"})
    assert same.status_code == 200
    assert list(Segment.objects.exclude(slug="vip").values_list("slug", "name", "priority")) == [
        row for row in before if row[0] != "vip"
    ]


def test_an_inflating_upload_never_blocks_the_web_process_and_is_refused_in_the_background(
    api, snapshot, settings
):
    from gatekeeper.celery import app
    from tests.support.files import inflating_gzip

    settings.GATEKEEPER_USER_LIST_MAX_BYTES = 64 * 2**20
    m = api("marketer")
    bomb = inflating_gzip(b"1\n", 1024 * 2**20)  # 1 MB that inflates to 1 GB
    app.conf.task_always_eager = True
    try:
        taken = call(m, "PUT", "/api/v1/segments/vip/users/", data=bomb)
    finally:
        app.conf.task_always_eager = False
    # The web process read 32 MiB of it (GATEKEEPER_USER_LIST_INLINE_BYTES) and handed it on.
    assert taken.status_code == 202, taken.text
    assert taken.json()["status"] == "validating"
    assert taken.headers["Location"].endswith("/api/v1/segments/vip/users/")
    lists = call(m, "GET", "/api/v1/segments/vip/users/").json()["results"]
    assert lists[0]["status"] == "failed" and "GATEKEEPER_USER_LIST_MAX_BYTES" in lists[0]["error"]
    assert [entry["status"] for entry in lists[1:]] == ["ready"]  # the list it was to replace


def test_an_upload_declared_above_the_limit_is_a_413_before_it_is_read(api, snapshot, settings):
    settings.GATEKEEPER_USER_LIST_MAX_UPLOAD_BYTES = 1000
    response = call(api("marketer"), "PUT", "/api/v1/segments/vip/users/", data=b"1\n" * 600)
    assert response.status_code == 413
    assert "at most 1,000 bytes" in response.json()["detail"]


@pytest.mark.parametrize(("role", "method", "path"), JSON_ENDPOINTS)
def test_bytes_that_are_not_utf8_are_a_400_on_every_json_endpoint(
    api, snapshot, role, method, path
):
    body = b'{"\xff\xfe": 1}'  # a key (every body has one) that is not UTF-8
    response = call(
        api(role), method, path, data=body, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 400, response.text
    assert "not UTF-8" in response.json()["detail"]


def test_text_in_a_path_that_cannot_name_anything_is_a_400_not_a_database_error(api, snapshot):
    m = api("marketer")
    for segment in ("%00", "a%20b", "%F0%9F%98%80"):
        response = call(
            m, "PUT", f"/api/v1/limits/{segment}/email/", json={"daily": 1, "weekly": 1}
        )
        assert response.status_code == 400 and "segment" in response.json(), segment


def test_a_rollback_while_redis_is_down_is_a_503_that_says_nothing_changed(api, snapshot, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    from gatekeeper.lib.redis_client import reset_redis_clients

    reset_redis_clients()
    response = call(api("marketer"), "POST", f"/api/v1/snapshots/{snapshot}/activate/")
    assert response.status_code == 503 and "nothing was changed" in response.json()["detail"]


# A number in a URL is exactly its digits: a space or a newline around them is not the id.
PADDED = ["%201", "1%20", "1%0A", "%0A1", "%091", "+1"]


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/users/{}/quota/",
        "/api/v1/users/{}/history/",
        "/api/v1/suppressions/email/{}/",
        "/api/v1/suppressions/?user_id={}",
        "/api/v1/segments/lookup/?user_id={}",
        "/api/v1/suppressions/?limit={}",
        "/api/v1/suppressions/?before={}",
        "/api/v1/users/1/history/?limit={}",
    ],
)
def test_a_number_in_a_url_with_a_space_or_a_newline_is_a_400_naming_it(api, snapshot, path):
    session = api("marketer")
    field = path.rsplit("?", 1)[1].split("=")[0] if "?" in path else "user_id"
    for padded in PADDED:
        response = call(session, "GET", path.format(padded))
        assert response.status_code == 400, (padded, response.text)
        assert list(response.json()) == [field], (padded, response.json())
    assert call(session, "GET", path.format("1")).status_code != 400  # the digits alone are
