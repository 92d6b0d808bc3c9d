"""limits/reasons.py is the one place a reason, a send outcome or a category is spelled: the code
reads them from there, and nothing anywhere (code, benchmarks or tests) compares a decision, a
send or a job with a word that is not in it."""

import ast
from collections.abc import Iterator
from pathlib import Path

from limits.engine.table import RuleView
from limits.models.people import Suppression
from limits.reasons import (
    ADMITTED,
    CAPPED,
    CATEGORIES,
    DEFERRABLE,
    HELD,
    JOB_OUTCOMES,
    JOB_OWN,
    JOB_REASONS,
    MARKETING_REASONS,
    OUTCOMES,
    REASONS,
    REFUSED,
    SENDING,
    Reason,
)

ROOT = Path(__file__).resolve().parents[2]
CODE = ("limits", "worker", "segments", "gatekeeper", "bench")
REGISTRY = ROOT / "limits" / "reasons.py"
# The words of reasons, outcomes and categories, and why a user is on the suppression list
# (the model's own choices): what a `reason`, `outcome` or `category` may be compared with.
KNOWN = {*JOB_REASONS, *OUTCOMES, *JOB_OUTCOMES, *CATEGORIES, *Suppression.Reason.values}
# Words that code must read from limits.reasons, never spell.
SPELLED_THERE = {*JOB_REASONS, *OUTCOMES, *JOB_OUTCOMES, *CATEGORIES}
NAMES = {"reason", "reasons", "outcome", "outcomes", "category", "unclaimed_as"}


def _sources(*tops: str) -> Iterator[Path]:
    for top in tops:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "migrations" not in path.parts and path != REGISTRY:
                yield path


def _named(node: ast.AST) -> bool:
    """An expression that holds a reason, an outcome or a category: `d.reason`, `reason`,
    `row["reason"]`, `outcomes[...]`'s key, `[d.reason for d in ...]`."""
    if isinstance(node, ast.Attribute):
        return node.attr in NAMES
    if isinstance(node, ast.Name):
        return node.id in NAMES
    if isinstance(node, ast.Subscript):
        key = node.slice
        return isinstance(key, ast.Constant) and key.value in NAMES
    if isinstance(node, ast.ListComp | ast.SetComp | ast.GeneratorExp):
        return _named(node.elt)
    return False


def _words(node: ast.AST) -> Iterator[ast.Constant]:
    """The string literals of an expression compared with a reason: itself, or a collection's."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node
    elif isinstance(node, ast.Tuple | ast.List | ast.Set):
        for element in node.elts:
            yield from _words(element)


def _uses(tree: ast.AST) -> Iterator[ast.Constant]:
    """Every literal the code compares a reason, an outcome or a category with, or gives as
    one (`reason="..."`, `outcomes["sent"]`)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_named(side) for side in sides):
                for side in sides:
                    yield from _words(side)
        elif isinstance(node, ast.keyword) and node.arg in ("reason", "outcome", "category"):
            yield from _words(node.value)
        elif isinstance(node, ast.Subscript) and _named(node.value):
            yield from _words(node.slice)


def _with_lines(path: Path) -> Iterator[tuple[ast.Constant, str]]:
    text = path.read_text()
    lines = text.splitlines()
    for word in _uses(ast.parse(text)):
        yield word, lines[word.lineno - 1]


def test_every_reason_outcome_and_category_anywhere_is_one_of_the_registry():
    unknown = [
        f"{path.relative_to(ROOT)}:{word.lineno}: {word.value!r}"
        for path in _sources(*CODE, "tests")
        for word, line in _with_lines(path)
        # Free text (a quota reset's why, an SMTP refusal's), or a bad word a test gives.
        if word.value.isidentifier()
        and word.value.islower()
        and word.value not in KNOWN
        and "# unknown on purpose" not in line
    ]
    assert not unknown, "Not in limits/reasons.py:\n" + "\n".join(unknown)


def test_the_code_reads_every_reason_from_the_registry_and_spells_none():
    spelled = [
        f"{path.relative_to(ROOT)}:{word.lineno}: {word.value!r}"
        for path in _sources(*CODE)
        for word in _uses(ast.parse(path.read_text()))
        if word.value in SPELLED_THERE
    ]
    assert not spelled, "Read these from limits.reasons:\n" + "\n".join(spelled)


def test_the_groups_cover_the_reasons_once():
    assert set(ADMITTED) | set(REFUSED) == set(REASONS)
    assert not set(ADMITTED) & set(REFUSED)
    assert set(CAPPED) <= set(DEFERRABLE) <= set(REFUSED)
    assert set(REASONS) < set(JOB_REASONS)  # a job adds its own (expired, cancelled)
    assert set(JOB_REASONS) - set(REASONS) == set(JOB_OWN)
    assert set(SENDING) < set(ADMITTED) and Reason.DUPLICATE not in SENDING
    assert set(HELD) <= set(DEFERRABLE)
    assert set(REASONS) - set(MARKETING_REASONS) == {Reason.EXEMPT}


def _reason_groups(tree: ast.AST) -> Iterator[ast.expr]:
    """Every tuple, list or set written with two or more reasons (`Reason.X`) in it, but a
    stage's declaration of the reasons it answers (`Stage(name, (...), run)`)."""
    declared = {
        id(arg)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "Stage"
        for arg in node.args
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Tuple | ast.List | ast.Set) and id(node) not in declared:
            members = [
                e
                for e in node.elts
                if isinstance(e, ast.Attribute)
                and isinstance(e.value, ast.Name)
                and e.value.id == "Reason"
            ]
            if len(members) >= 2:
                yield node


def test_a_group_of_reasons_is_named_in_the_registry_alone():
    written = [
        f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}"
        for path in _sources(*CODE)
        for node in _reason_groups(ast.parse(path.read_text()))
    ]
    assert not written, "Name these groups in limits/reasons.py:\n" + "\n".join(written)


def test_a_rule_refuses_with_a_reason_of_the_registry():
    for seconds, unit, limit in (
        (86_400, "", 3),
        (604_800, "", 3),
        (3_600, "", 3),
        (None, "day", 0),
    ):
        view = RuleView(
            id=1, name="r", segment=None, channel="email", match="any", tag="",
            window_kind="calendar" if unit else "rolling", window_seconds=seconds,
            window_unit=unit, limit=limit, reserve_below_priority=None, reserve_slots=None,
        )  # fmt: skip
        assert view.reason() in REASONS and isinstance(view.reason(), Reason)
