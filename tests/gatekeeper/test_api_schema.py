"""The OpenAPI schema and its docs."""

from typing import Any

import pytest

from tests.support.api import call

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


def _schemas(node, path=""):
    """(path, schema) for every schema in an OpenAPI document: each `schema` (parameters, media
    types), each component, and the schemas inside them (properties, items, ...)."""

    def inside(schema, where):
        if not isinstance(schema, dict):
            return
        yield where, schema
        for key in ("items", "additionalProperties", "not"):
            yield from inside(schema.get(key), f"{where}/{key}")
        for key in ("allOf", "oneOf", "anyOf"):
            for i, option in enumerate(schema.get(key, [])):
                yield from inside(option, f"{where}/{key}/{i}")
        for name, prop in schema.get("properties", {}).items():
            yield from inside(prop, f"{where}/properties/{name}")

    if isinstance(node, list):
        for i, item in enumerate(node):
            yield from _schemas(item, f"{path}/{i}")
    elif isinstance(node, dict):
        for key, value in node.items():
            if key == "schema":
                yield from inside(value, f"{path}/schema")
            elif key == "schemas" and path == "/components":
                for name, schema in value.items():
                    yield from inside(schema, f"{path}/schemas/{name}")
            elif key not in ("example", "examples"):
                yield from _schemas(value, f"{path}/{key}")


SHAPED = ("type", "$ref", "allOf", "oneOf", "anyOf")


def test_every_nullable_has_a_type_and_every_property_a_shape(api):
    """OpenAPI 3.0.3: `nullable` adds null to the `type` beside it and to nothing else, so a
    `nullable` without one (drf-spectacular's `allOf: [$ref]` + `nullable`) refuses null, and
    clients that validate answers reject every null the server sends; a property of no shape
    (a bare JSONField) tells a client nothing."""
    served = call(api("anonymous"), "GET", "/api/schema/?format=json").json()
    assert served["openapi"] == "3.0.3"
    found = list(_schemas(served))
    assert len(found) > 500  # the walk reaches into the components and the paths
    untyped = [where for where, schema in found if "nullable" in schema and "type" not in schema]
    assert untyped == []
    shapeless = [
        where
        for where, schema in found
        if where.rsplit("/", 2)[-2] == "properties" and not any(key in schema for key in SHAPED)
    ]
    assert shapeless == []
    # A nullable typed with an enum lists null among its values (else the enum refuses it).
    assert [
        where
        for where, schema in found
        if schema.get("nullable") and "enum" in schema and None not in schema["enum"]
    ] == []


def test_the_nullable_references_take_null_and_their_objects_by_the_served_schema(api):
    from openapi_schema_validator import OAS30ReadValidator

    served = call(api("anonymous"), "GET", "/api/schema/?format=json").json()
    components = served["components"]["schemas"]
    for component, field in [
        ("Decision", "rule"),
        ("HistoryDecision", "rule"),
        ("Rule", "reserve"),
        ("RuleQuota", "reserve"),
        ("RuleCreateBody", "reserve"),
        ("RuleChangeBody", "reserve"),
    ]:
        schema = {**components[component]["properties"][field], "components": served["components"]}
        validator = OAS30ReadValidator(schema)
        assert validator.is_valid(None), (component, field)
        assert not validator.is_valid(3), (component, field)
        assert not validator.is_valid({}), (component, field)  # an object must be the real one


def validator(schema):
    from openapi_schema_validator import OAS30Validator

    return OAS30Validator({**schema, "components": {"schemas": COMPONENTS}})


NULL_ONLY = {"type": "object", "nullable": True, "enum": [None]}
PET_REF = {"$ref": "#/components/schemas/Pet"}
COMPONENTS: dict[str, dict[str, Any]] = {
    "Pet": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    "Cat": {
        "type": "object",
        "properties": {"kind": {"type": "string"}, "name": {"type": "string"}},
        "required": ["kind", "name"],
    },
    "NullEnum": {"enum": [None]},
    "KindEnum": {"type": "string", "enum": ["a", "b"]},
}
KIND_OR_NULL = [
    {"$ref": "#/components/schemas/KindEnum"},
    {"$ref": "#/components/schemas/NullEnum"},
]
CATS = {"oneOf": [{"$ref": "#/components/schemas/Cat"}], "discriminator": {"propertyName": "kind"}}


@pytest.mark.parametrize(
    "form",
    [
        {"allOf": [PET_REF], "nullable": True},  # drf-spectacular's
        {"allOf": [PET_REF], "nullable": True, "type": "object"},  # with the type lint asks for
    ],
)
def test_a_nullable_all_of_refuses_null_in_openapi_3_0_3(form):
    """`nullable` adds null to the `type` beside it; the allOf keeps its own veto."""
    assert validator(form).is_valid({"name": "x"})
    assert not validator(form).is_valid(None)


@pytest.mark.parametrize(
    ("given", "written", "taken", "refused"),
    [
        # drf-spectacular's nullable nested serializer, and a reference marked nullable.
        (
            {"allOf": [PET_REF], "nullable": True, "readOnly": True},
            {"readOnly": True, "oneOf": [PET_REF, NULL_ONLY]},
            {"name": "x"},
            {},
        ),
        ({**PET_REF, "nullable": True}, {"oneOf": [PET_REF, NULL_ONLY]}, {"name": "x"}, "x"),
        # With `type: object` beside the allOf, null is still refused by the allOf: a choice.
        (
            {"type": "object", "allOf": [PET_REF], "nullable": True, "description": "d"},
            {"description": "d", "oneOf": [{"type": "object", "allOf": [PET_REF]}, NULL_ONLY]},
            {"name": "x"},
            {},
        ),
        # A typed one stays as it is, an enum beside it with null among its values.
        ({"type": "integer", "nullable": True}, {"type": "integer", "nullable": True}, 3, "3"),
        (
            {"type": "string", "enum": ["a"], "nullable": True},
            {"type": "string", "enum": ["a", None], "nullable": True},
            "a",
            "b",
        ),
        # A plain choice gets null as one more option; one that takes null already is left.
        (
            {"oneOf": [PET_REF, {"type": "integer"}], "nullable": True},
            {"oneOf": [PET_REF, {"type": "integer"}, NULL_ONLY]},
            7,
            "x",
        ),
        ({"oneOf": KIND_OR_NULL, "nullable": True}, {"oneOf": KIND_OR_NULL}, "a", "c"),
        # A tagged union keeps its discriminator beside its own options.
        (
            {**CATS, "nullable": True},
            {"oneOf": [CATS, NULL_ONLY]},
            {"name": "x", "kind": "Cat"},
            {"kind": "Cat"},
        ),
        # Untyped: every value is taken already, null among them.
        ({"nullable": True, "description": "d"}, {"description": "d"}, [1], None),
    ],
)
def test_a_nullable_schema_takes_null_in_openapi_3_0_3(given, written, taken, refused):
    from gatekeeper.lib.bodies import nullable_schema

    result = nullable_schema(given, lambda ref: COMPONENTS.get(ref.rpartition("/")[2]))
    assert result == written
    assert validator(result).is_valid(None)
    assert validator(result).is_valid(taken)
    if refused is not None:
        assert not validator(result).is_valid(refused)
