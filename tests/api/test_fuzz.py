"""A fuzzing pass with schemathesis against the schema the live server serves: no 5xx, every
status code documented, and every response conforms to the schema.

The schema is fetched from the live server inside the test (schemathesis' `from_fixture` does
not run under pytest 9), and each operation gets its own hypothesis run.
"""

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
    assert len(operations) == 19  # every endpoint of v1, so none is left out

    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
        def fuzz(case: schemathesis.Case) -> None:
            note(f"{case.method} {case.formatted_path}")
            case.call_and_validate(base_url=live_server.url, headers=headers, checks=CHECKS)

        fuzz()
