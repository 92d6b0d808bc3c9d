"""A fuzzing pass with schemathesis against the project's own schema, over a live server:
no 5xx, and every response conforms to the schema."""

import json

import pytest
import schemathesis
from django.contrib.auth.models import User
from hypothesis import HealthCheck, settings
from rest_framework.authtoken.models import Token
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
)


def _own_schema() -> dict:
    # The same document /api/schema/ serves (a test below checks that it is served).
    from drf_spectacular.generators import SchemaGenerator

    return SchemaGenerator().get_schema(request=None, public=True)


schema = schemathesis.openapi.from_dict(json.loads(json.dumps(_own_schema(), default=str)))


@pytest.fixture
def fuzz_target(live_server, transactional_db, redis_client, snapshot):
    admin = User.objects.create_superuser("fuzzer", "f@example.com", "pw")
    token, _ = Token.objects.get_or_create(user=admin)
    return live_server.url, {"Authorization": f"Token {token.key}"}


@pytest.mark.slow
@schema.parametrize()
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors_and_responses_match_the_schema(case, fuzz_target):
    base_url, headers = fuzz_target
    case.call_and_validate(
        base_url=base_url,
        headers=headers,
        checks=[not_a_server_error, response_schema_conformance, content_type_conformance],
    )
