"""An error that carries a problem (gatekeeper.lib.problems) reaches the client as its field-400
through the REST API's base alone: a service raises it, no view catches it, and the body is the
error's `field_errors()` as it is (a file's `line` stays a number, or null)."""

import ast
import inspect
import io
import json
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory, force_authenticate

from gatekeeper.lib.api import JsonAPIView
from gatekeeper.lib.problems import CarriesProblems, Problem, Problems
from limits.models.people import Preference, Suppression
from limits.people.preferences import preferences_user_id
from limits.people.preferences_import import PreferencesFileRefused
from limits.people.preferences_import import Problem as LineProblem
from limits.people.suppression import suppression_import
from segments.parsing import UserListError
from tests.support.api import call, make_user, token_session

ROOT = Path(__file__).resolve().parents[2]
API_MODULES = (
    *sorted((ROOT / "limits" / "api").glob("*.py")),
    ROOT / "limits" / "ledger" / "api.py",
    ROOT / "worker" / "api.py",
    ROOT / "segments" / "api.py",
)


class NotAColour(Problem):
    """A problem of a kind the API base has never heard of: it is answered all the same."""


class Raising(JsonAPIView):
    rights = {"GET": ()}
    error: Exception = Problem("")

    def get(self, request: Request) -> Response:
        raise self.error


def answered(error: Exception) -> tuple[int, object]:
    request = APIRequestFactory().get("/")
    force_authenticate(request, user=User(username="someone", is_active=True))
    response = Raising.as_view(error=error)(request)
    response.render()
    return response.status_code, json.loads(response.content)


@pytest.mark.parametrize(
    ("error", "body"),
    [
        (NotAColour("'mauve' is no colour.", field="colour"), {"colour": ["'mauve' is no colour."]}),
        (Problem("Send a body."), {"non_field_errors": ["Send a body."]}),
        (Problems({"a": ["one."], "b.0": ["two."]}), {"a": ["one."], "b.0": ["two."]}),
        (UserListError("line 3: 'x' is not a user id.", line=3), {
            "file": ["line 3: 'x' is not a user id."], "line": 3,
        }),
        (UserListError("Send the list as the request body."), {
            "file": ["Send the list as the request body."], "line": None,
        }),
        (PreferencesFileRefused(["1 problem."], line=2, problems=[LineProblem(2, "user_id", "No.")]), {
            "file": ["1 problem."], "line": 2,
            "problems": [{"line": 2, "field": "user_id", "message": "No."}],
        }),
    ],
)  # fmt: skip
def test_any_error_carrying_problems_is_the_400_of_its_field_errors(error: Exception, body):
    assert isinstance(error, CarriesProblems)
    assert answered(error) == (400, body)


def test_other_errors_are_not_taken_for_problems():
    assert not isinstance(ValueError("x"), CarriesProblems)
    with pytest.raises(ValueError, match="a bug"):
        answered(ValueError("a bug"))


@pytest.mark.django_db(transaction=True)
def test_a_services_problem_reaches_the_client_as_the_field_400(live_server, redis_client):
    """The services raise; the views only call them: the bodies are the errors' own."""
    ops = token_session(
        live_server.url,
        make_user("ops", "limits.change_preference", "limits.add_suppression"),
    )
    with pytest.raises(Problem) as by_the_service:
        preferences_user_id(8, path=7)
    over_http = call(ops, "PUT", "/api/v1/users/7/preferences/", json={"user_id": 8})
    assert over_http.status_code == 400
    assert over_http.json() == by_the_service.value.field_errors()
    assert list(over_http.json()) == ["user_id"]
    assert not Preference.objects.exists()

    bad_file = b"14\n15\nabc\n"
    with pytest.raises(UserListError) as refused_file:
        suppression_import(
            channel="email", fileobj=io.BytesIO(bad_file), reason="manual", source="import"
        )
    over_http = call(ops, "PUT", "/api/v1/suppressions/email/import/", data=bad_file)
    assert over_http.status_code == 400
    assert over_http.json() == refused_file.value.field_errors()
    assert over_http.json()["line"] == 3
    assert not Suppression.objects.exists()


def _caught(handler: ast.ExceptHandler, module: object) -> list[type]:
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    found = [getattr(module, n.id, None) for n in names if isinstance(n, ast.Name)]
    return [t for t in found if isinstance(t, type)]


def test_no_view_turns_an_error_carrying_problems_into_a_400_by_hand():
    """A view may gather problems to answer them all at once (`exc.field_errors()`), never
    catch one to build its 400 itself."""
    import importlib

    by_hand = []
    for path in API_MODULES:
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        module = importlib.import_module(name)
        source = inspect.getsource(module)
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.ExceptHandler) or node.type is None:
                continue
            carries = [t for t in _caught(node, module) if issubclass(t, CarriesProblems)]
            gathers = "field_errors()" in ast.unparse(node)
            if carries and not gathers:
                by_hand.append(f"{name}:{node.lineno}: except {carries[0].__name__}")
    assert not by_hand, "Let the API base answer these:\n" + "\n".join(by_hand)
