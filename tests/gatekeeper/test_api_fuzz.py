"""A fuzzing pass with schemathesis against the schema the live server serves: no 5xx, every
status code documented, every response conforms to the schema, and the schema says exactly what
the server takes: data it calls valid is accepted (positive_data_acceptance) and data it calls
invalid is refused (negative_data_rejection). Each generated body is also sent again with
unencodable strings and nested thousands deep, which must be refused (400).

The schema is fetched from the live server inside the test (schemathesis' `from_fixture` does
not run under pytest 9), and each operation gets its own hypothesis run per generation mode; the
operations are shared among a few parts of the test, which the test processes run side by side.
"""

import itertools
from typing import Any

import pytest
import schemathesis
from django.contrib.auth.models import User
from hypothesis import HealthCheck, given, note, settings
from hypothesis.errors import Unsatisfiable
from rest_framework.authtoken.models import Token
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    positive_data_acceptance,
    response_schema_conformance,
    status_code_conformance,
)

from gatekeeper.api_urls import v1
from tests.conftest import examples

pytestmark = pytest.mark.postgres

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    response_schema_conformance,
    content_type_conformance,
    negative_data_rejection,
]
# Where valid data may be refused, because OpenAPI 3.0 cannot say what the server checks: a
# user list's lines, and those of a file of ids to suppress (the body is a binary file, maybe
# gzip); a send job's addresses, whose rule
# depends on the job's channel (an email address, a push token), as its templates do, and its
# recipients' time zones (an unknown one is a row's error, refused or skipped as on_invalid
# says); a rule's fields as a whole (a tag rule needs its tag and only it takes one, a
# reserve keeps at most the limit, the segment must exist); and quiet hours' fields as a whole
# (the end differs from the start, the spread is shorter than the day outside the quiet hours,
# the segment must exist); and a person's preferences (topics that exist, on their channels;
# pauses in the future; a frequency tighter than the rules on everyone); and the control
# group (a share of 0 or from 0.1 %, segments that exist).
NOT_EXPRESSIBLE = {
    "PUT /api/v1/segments/{slug}/users/",
    "PUT /api/v1/suppressions/{channel}/import/",
    "PUT /api/v1/preferences/import/",
    "PUT /api/v1/holdout/",
    # An experiment's arms, times and segment are checked whole (shares adding up to at most 1,
    # a start before the end and not past, no overlap with another): more than a schema says.
    "POST /api/v1/experiments/",
    "PATCH /api/v1/experiments/{experiment_id}/",
    "POST /api/v1/experiments/{experiment_id}/conclude/",
    # An event's time is within the last GATEKEEPER_EVENTS_DEDUP_DAYS days, not ahead.
    "POST /api/v1/events/",
    "POST /api/v1/sends/",
    # A job's start is in the future, its expiry after its start, its template exists.
    "PATCH /api/v1/sends/{job_id}/",
    "POST /api/v1/rules/",
    "PATCH /api/v1/rules/{rule_id}/",
    "POST /api/v1/quiet-hours/",
    "PATCH /api/v1/quiet-hours/{quiet_hours_id}/",
    "PUT /api/v1/users/{user_id}/preferences/",
    "PATCH /api/v1/users/{user_id}/preferences/",
    # A backtest's period is inside the ledger's days (GATEKEEPER_LEDGER_DAYS back from today)
    # with `from` before `to`, and its draft's changes are checked as saving them would be
    # (rules and quiet hours whole, rows that exist, segments and channels that exist).
    "POST /api/v1/backtests/",
    # A round's closes_at is in the future and at most 90 days ahead, its send_at not before it,
    # its name not blank; it is edited and cancelled only while open (a 409 after).
    "POST /api/v1/rounds/",
    "PATCH /api/v1/rounds/{round_id}/",
    "POST /api/v1/rounds/{round_id}/cancel/",
    # A projection's values are keyed by the round's own jobs' ids, each at least 0 (a schema of
    # OpenAPI 3.0 cannot say what an object's keys are); an open round's only (a 409 after).
    "POST /api/v1/rounds/{round_id}/report/",
    # A mailbox provider's fields are checked whole: a domain in one group only, `other` naming
    # none, each dispatcher's rate once with at least one period, at most 50 groups, a slug not
    # taken; a group a warm-up plan names is not deleted (nor `other`). A resume needs a paused
    # group (a 409 otherwise).
    "POST /api/v1/mailbox-providers/",
    "PATCH /api/v1/mailbox-providers/{slug}/",
    "DELETE /api/v1/mailbox-providers/{slug}/",
    "POST /api/v1/mailbox-providers/{slug}/resume/",
    # A warm-up plan's groups exist (an object's keys are beyond OpenAPI 3.0), each day's volume
    # is in its bounds (the schema states them, the rule says which group and day), one plan a
    # domain.
    "POST /api/v1/warmups/",
    "PATCH /api/v1/warmups/{warmup_id}/",
}
QUOTA = "GET /api/v1/users/{user_id}/quota/"
HISTORY = "GET /api/v1/users/{user_id}/history/"
PLAN = "GET /api/v1/plan/"
REPORT = "GET /api/v1/reports/decisions/"
STUDY_REPORT = "GET /api/v1/reports/experiments/{study}/"


def may_refuse_valid_data(case: schemathesis.Case) -> bool:
    if case.operation.label in NOT_EXPRESSIBLE:
        return True
    # A send's topic: a slug's form, while the topics that exist (and their channels) are the
    # marketer's.
    if isinstance(case.body, dict) and case.body.get("topic"):
        return True
    # The schema states a time zone name's form; the server's zone database decides which names
    # exist (the schema does not list them: see segments/bodies.py).
    if names_a_time_zone(case.body) or (case.query or {}).get("time_zone"):
        return True
    # A quota's ?window= is a number and a unit from 1 minute to as far back as the log keeps
    # sends (which depends on the rules): a pattern states its form, not its bounds.
    if case.operation.label == QUOTA and "window" in (case.query or {}):
        return True
    # A history's (and the plan's) ?from= and ?to=: a pattern states the form of a day or an instant, not the
    # calendar (2026-02-30), and `to` must come after `from`.
    if case.operation.label in (HISTORY, PLAN) and bool({"from", "to"} & set(case.query or {})):
        return True
    # The decisions report's ?from= and ?to=: a date's form, not the days the ledger keeps
    # (GATEKEEPER_LEDGER_DAYS back from today) nor `from` before `to`; the same for an
    # experiment's report (a period of at most a year).
    return case.operation.label in (REPORT, STUDY_REPORT) and bool(
        {"from", "to"} & set(case.query or {})
    )


def skips_bad_rows(case: schemathesis.Case) -> bool:
    body = case.body
    return (
        case.operation.label == "POST /api/v1/sends/"
        and isinstance(body, dict)
        and body.get("on_invalid") == "skip"
        and isinstance(body.get("recipients"), list)
    )


def names_a_time_zone(value: Any) -> bool:
    if isinstance(value, dict):
        return bool(value.get("time_zone")) or any(names_a_time_zone(v) for v in value.values())
    if isinstance(value, list):
        return any(names_a_time_zone(v) for v in value)
    return False


# Every operation of v1 in both modes is the suite's longest work (about 140 s on a quiet machine
# under the `ci` profile): it is cut into parts of every PARTS-th operation, so that the test
# processes share it instead of one of them running it while the others wait at the end. The
# guard against a hang stays generous, or a machine kept twice as busy as usual fails a part for
# its length alone.
PARTS = 4


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("part", range(PARTS), ids=[f"part{n + 1}of{PARTS}" for n in range(PARTS)])
def test_no_server_errors_and_responses_match_the_served_schema(
    part, live_server, transactional_db, redis_client, snapshot
):
    admin = User.objects.create_superuser("fuzzer", "f@example.com", "pw")
    token, _ = Token.objects.get_or_create(user=admin)
    headers = {"Authorization": f"Token {token.key}"}
    schema = schemathesis.openapi.from_url(f"{live_server.url}/api/schema/?format=json")
    operations = sorted((result.ok() for result in schema.get_all_operations()), key=label)
    # Every method of every endpoint of v1 (each view names its rights per method), so none
    # is left out, and each operation is in one part only.
    views = [p.callback.view_class for p in v1]  # type: ignore[attr-defined]
    assert len(operations) == sum(len(view.rights) for view in views)
    assert len({label(operation) for operation in operations}) == len(operations)
    for operation, mode in itertools.product(operations[part::PARTS], GenerationMode):
        takes = len(operation.body) + len(operation.path_parameters) + len(operation.query)
        if mode == GenerationMode.NEGATIVE and not takes:
            continue  # nothing in the request to make invalid
        fuzz(operation, mode, live_server.url, headers)


def label(operation: Any) -> str:
    return str(operation.label)


def fuzz(operation: Any, mode: GenerationMode, base: str, headers: dict) -> None:
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=examples(30), deadline=None, suppress_health_check=list(HealthCheck))
    def run(case: schemathesis.Case) -> None:
        note(f"{case.method} {case.formatted_path} ({mode.value})")
        checks = list(CHECKS)
        if skips_bad_rows(case):
            # A send job with on_invalid: skip takes a recipient row that breaks the schema (a
            # user id out of range, say) and counts it as invalid: a 202, by design.
            checks.remove(negative_data_rejection)
        if not may_refuse_valid_data(case):
            checks.append(positive_data_acceptance)
        case.call_and_validate(base_url=base, headers=headers, checks=checks)
        if not isinstance(case.body, dict) or mode != GenerationMode.POSITIVE:
            return
        # The same request with every string made unencodable (a lone surrogate), then with
        # the body nested thousands deep: refused with a 400, never a 5xx.
        spoiled, strings = with_lone_surrogates(case.body)
        answer = case.call(base_url=base, headers=headers, json=spoiled)
        assert answer.status_code < 500, answer.text
        if strings:
            assert answer.status_code in (400, 404), (answer.status_code, answer.text)
        deep = case.call(
            base_url=base,
            headers={**headers, "Content-Type": "application/json"},
            data="[" * 3000 + "]" * 3000,
        )
        assert deep.status_code in (400, 404), (deep.status_code, deep.text)

    try:
        run()
    except Unsatisfiable:
        # Some operations take only a path part whose invalid values schemathesis cannot put
        # in a URL (a slug's): there is no negative request to make.
        if mode != GenerationMode.NEGATIVE:
            raise


def with_lone_surrogates(value: Any) -> tuple[Any, int]:
    """`value` with "\\ud800" appended to every string in it, and how many strings there were."""
    if isinstance(value, str):
        return value + "\ud800", 1
    if isinstance(value, list):
        spoiled = [with_lone_surrogates(v) for v in value]
        return [v for v, _ in spoiled], sum(n for _, n in spoiled)
    if isinstance(value, dict):
        fields = {k: with_lone_surrogates(v) for k, v in value.items()}
        return {k: v for k, (v, _) in fields.items()}, sum(n for _, n in fields.values())
    return value, 0
