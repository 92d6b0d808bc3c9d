"""A fuzzing pass with schemathesis against the schema the live server serves: no 5xx, every
status code documented, and every response conforms to the schema. Each generated body is also
sent again with unencodable strings and nested thousands deep, which must be refused (400).

The schema is fetched from the live server inside the test (schemathesis' `from_fixture` does
not run under pytest 9), and each operation gets its own hypothesis run.
"""

from typing import Any

import pytest
import schemathesis
from django.contrib.auth.models import User
from hypothesis import HealthCheck, given, note, settings
from rest_framework.authtoken.models import Token
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    response_schema_conformance,
    content_type_conformance,
]


@pytest.mark.slow
def test_no_server_errors_and_responses_match_the_served_schema(
    live_server, transactional_db, redis_client, snapshot
):
    admin = User.objects.create_superuser("fuzzer", "f@example.com", "pw")
    token, _ = Token.objects.get_or_create(user=admin)
    headers = {"Authorization": f"Token {token.key}"}
    schema = schemathesis.openapi.from_url(f"{live_server.url}/api/schema/?format=json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 20  # every endpoint of v1, so none is left out

    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
        def fuzz(case: schemathesis.Case) -> None:
            note(f"{case.method} {case.formatted_path}")
            case.call_and_validate(base_url=live_server.url, headers=headers, checks=CHECKS)
            if not isinstance(case.body, dict):
                return
            # The same request with every string made unencodable (a lone surrogate), then
            # with the body nested thousands deep: refused with a 400, never a 5xx.
            spoiled, strings = with_lone_surrogates(case.body)
            answer = case.call(base_url=live_server.url, headers=headers, json=spoiled)
            assert answer.status_code < 500, answer.text
            if strings:
                assert answer.status_code in (400, 404), (answer.status_code, answer.text)
            deep = case.call(
                base_url=live_server.url,
                headers={**headers, "Content-Type": "application/json"},
                data="[" * 3000 + "]" * 3000,
            )
            assert deep.status_code in (400, 404), (deep.status_code, deep.text)

        fuzz()


def with_lone_surrogates(value: Any) -> tuple[Any, int]:
    """`value` with "\ud800" appended to every string in it, and how many strings there were."""
    if isinstance(value, str):
        return value + "\ud800", 1
    if isinstance(value, list):
        spoiled = [with_lone_surrogates(v) for v in value]
        return [v for v, _ in spoiled], sum(n for _, n in spoiled)
    if isinstance(value, dict):
        fields = {k: with_lone_surrogates(v) for k, v in value.items()}
        return {k: v for k, (v, _) in fields.items()}, sum(n for _, n in fields.values())
    return value, 0
