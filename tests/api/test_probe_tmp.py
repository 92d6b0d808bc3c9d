import pytest
from tests.api.conftest import call

pytestmark = pytest.mark.django_db(transaction=True)

def test_probe(api, snapshot):
    m = api("marketer")
    cases = [
        ("PUT", "/api/v1/limits/default/email/", {"json": {"daily": 10**20, "weekly": 1}}),
        ("PUT", "/api/v1/limits/default/email/", {"json": {"daily": 2**31, "weekly": 1}}),
        ("PUT", "/api/v1/limits/default/email/", {"json": {"daily": True, "weekly": 1}}),
        ("PUT", "/api/v1/limits/default/email/", {"json": [1]}),
        ("POST", "/api/v1/segments/", {"json": {"slug": "x", "name": "n", "priority": 10**20}}),
        ("POST", "/api/v1/segments/", {"json": {"slug": "x", "name": "n", "priority": 10}}),
        ("POST", "/api/v1/segments/", {"json": {"slug": "x" * 100, "name": "n", "priority": 11}}),
        ("PATCH", "/api/v1/segments/vip/", {"json": {"slug": "default"}}),
        ("PATCH", "/api/v1/segments/vip/", {"json": {"is_default": True}}),
        ("PUT", "/api/v1/segments/vip/users/", {"data": b""}),
        ("PUT", "/api/v1/segments/vip/users/", {"data": b"\x1f\x8b\x08garbage"}),
        ("PUT", "/api/v1/segments/vip/users/", {"data": b"99999999999\n"}),
        ("GET", "/api/v1/users/99999999999/quota/", {}),
        ("GET", "/api/v1/users/abc/quota/", {}),
        ("GET", "/api/v1/segments/lookup/?user_id=1.5", {}),
        ("GET", "/api/v1/segments/lookup/?user_id=%EF%BC%91", {}),
        ("POST", "/api/v1/segments/lookup/", {"json": {"user_ids": ["\u0661"]}}),
        ("POST", "/api/v1/segments/lookup/", {"json": {"user_ids": [1.0]}}),
        ("POST", "/api/v1/gate/check/", {"json": {"channel": "email", "campaign": 5, "requests": [{"user_id": 1, "message_id": "a"}]}}),
        ("POST", "/api/v1/gate/check/", {"json": {"channel": "email", "campaign": "", "requests": [{"user_id": 1, "message_id": "a"}]}}),
        ("POST", "/api/v1/gate/check/", {"data": "null", "headers": {"Content-Type": "application/json"}}),
        ("POST", "/api/v1/gate/check/", {"data": "x=1", "headers": {"Content-Type": "application/x-www-form-urlencoded"}}),
        ("POST", "/api/v1/gate/check/", {"data": "x", "headers": {"Content-Type": "text/plain"}}),
        ("POST", "/api/v1/sends/", {"json": {"channel": "fax", "campaign": "c", "template": "t", "recipients": [{"user_id": 1, "address": "a@b.c"}]}}),
        ("POST", "/api/v1/sends/", {"json": {"channel": "email", "campaign": "c", "template": "t", "recipients": [{"user_id": -1, "address": "a@b.c"}]}}),
        ("POST", "/api/v1/sends/", {"json": {"channel": "email", "campaign": "c", "template": "t", "recipients": [1]}}),
        ("POST", "/api/v1/sends/", {"json": {"channel": "email", "campaign": "c", "template": "t", "on_capped": "x", "recipients": [{"user_id": 1, "address": "a@b.c", "context": 5}]}}),
        ("GET", "/api/v1/sends/99999999999999999999999/", {}),
        ("GET", "/api/v1/builds/99999999999999999999999/", {}),
        ("POST", "/api/v1/snapshots/..%2F..%2Fetc/activate/", {}),
        ("POST", "/api/v1/snapshots/" + "a" * 300 + "/activate/", {}),
    ]
    for method, path, kw in cases:
        r = call(m, method, path, **kw)
        print(r.status_code, method, path[:60], str(kw)[:80], "->", r.text[:200])
