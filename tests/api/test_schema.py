"""The OpenAPI schema and its docs."""

import pytest

from tests.api.conftest import call

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_schema_and_docs_are_served(api):
    s = api("viewer")
    schema = call(s, "GET", "/api/schema/?format=json").json()
    assert "/api/v1/gate/check/" in schema["paths"]
    assert call(s, "GET", "/api/docs/").status_code == 200


def test_the_served_schema_is_the_documented_one_and_the_docs_work_offline(api):
    from drf_spectacular.generators import SchemaGenerator

    s = api("anonymous")
    served = call(s, "GET", "/api/schema/?format=json").json()
    generated = SchemaGenerator().get_schema(request=None, public=True)
    assert sorted(served["paths"]) == sorted(generated["paths"])
    gate = served["paths"]["/api/v1/gate/check/"]["post"]
    assert set(gate["responses"]) == {"200", "400", "401", "403", "413"}
    assert list(gate["requestBody"]["content"]) == ["application/json"]
    docs = call(s, "GET", "/api/docs/")
    assert docs.status_code == 200
    assets = [
        part.split('"')[0] for part in docs.text.split('src="')[1:] if part.startswith("/static/")
    ]
    assert assets, "Swagger UI's scripts come from this server"
    for asset in assets:
        assert call(s, "GET", asset).status_code == 200, asset
