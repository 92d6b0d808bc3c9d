"""The one write path for every setting: caps, cap rules, quiet hours, topics, the control
group, experiments and webhook endpoints are created, changed and deleted through a kind here,
each change recorded in the one history (`SettingChange`: kind, object and what it read as,
action, the JSON before and after, words, who and through what) in the same transaction.

`SettingKind.write` is the path: the kind's writers' lock, the row found and locked, the change
applied to it as it is now (not as the caller read it), the record written; anything the change
raises (a ValidationError by field, a Problem, a Conflict) rolls it all back and records
nothing; a change that changes nothing writes nothing; a named action (an experiment stopped or
concluded, a webhook endpoint given a new secret) is always recorded.

An authored kind (`AuthoredKind`: cap rules, quiet hours, topics) is a setting kind with its
editable fields (a dataclass named as the model's fields, the segment as its slug), the one
rule for a valid record (problems by field, named as the REST API names them), how a row reads
as fields, how fields are put on a row, and how a change reads in words. Its `create`, `update`
and `delete` are written once, here: the result is checked whole (the REST API's 400, the
admin form's errors), and the process's cache of rules is dropped once the transaction commits
(the others follow within GATEKEEPER_CAPS_TTL_SECONDS).
"""

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Generic, Protocol, TypeVar

from django.core.exceptions import ValidationError
from django.db import models, transaction

from gatekeeper.lib.accounts import account_acting
from gatekeeper.lib.ids import DATABASE_MAX
from limits.models.policy import Authored, SettingChange
from limits.policy.selectors import policy_cache
from segments.models import Segment

Action = SettingChange.Action
Kind = SettingChange.Kind


class Fields(Protocol):
    """A kind's editable fields (a dataclass). A kind whose rows apply to a segment names it
    `segment` (a slug; None: every one); a kind without one (topics) has no such field."""


T = TypeVar("T", bound=models.Model)
RowT = TypeVar("RowT", bound=Authored)
FieldsT = TypeVar("FieldsT", bound=Fields)
Names = Mapping[str, str]  # segment names by slug


def _no_guard(row: Any) -> None:
    return None


def _no_lock() -> None:
    return None


def _no_words(action: str, before: Any, after: Any) -> str:
    return ""


@dataclass(frozen=True, eq=False, kw_only=True)
class SettingKind(Generic[T]):
    """A kind of setting as the one write path sees it: its name in the history (`kind`), its
    model, how a row reads as JSON (as the REST API shows it, secrets left out: what the
    history keeps) and as a label, how a change reads in words, the writers' lock it takes
    before its row's (experiments: one writer at a time checks for overlaps), and whether the
    process's cache of rules is dropped once a change commits. Every create, change, delete
    and named action of every setting goes through `write`."""

    kind: str
    model: type[T]
    as_json: Callable[[T], dict[str, Any]]
    label: Callable[[T], str] = str
    worded: Callable[[str, Any, Any], str] = _no_words  # (action, before, after)
    lock: Callable[[], None] = _no_lock
    invalidates: bool = True
    singleton: bool = False  # one row (the control group): no object id in its history

    def words(self, action: str, before: Any, after: Any) -> str:
        """A change in plain words, from the JSON before and after."""
        return self.worded(action, before, after)

    def write(
        self,
        action: str | None,
        *,
        locate: Callable[[], T | None],
        change: Callable[[T | None], T | None],
        user: Any = None,
        via: str,
        words: str | Callable[[T], str] | None = None,
    ) -> T | None:
        """Write a change and its record in one transaction: the kind's lock taken, the row
        found and locked (`locate`: None for one to be made), `change` applied to it (it saves
        or deletes, returns the row as it is then, or None once deleted; anything it raises
        rolls the whole change back, nothing recorded), and one SettingChange written. The
        action None: created when there was no row, else changed. A change ("changed") that
        changes nothing the JSON shows writes no record; a named action always does. `words`:
        the change in words when the kind's own would not say it (a text, or read from the
        row as changed)."""
        with transaction.atomic():
            self.lock()
            row = locate()
            object_id = row.pk if row is not None else None
            label = self.label(row) if row is not None else ""
            before = self.as_json(row) if row is not None else None
            action = action or (Action.CREATED if row is None else Action.CHANGED)
            result = change(row)
            after = None
            if result is not None and action != Action.DELETED:
                after = self.as_json(result)
                object_id, label = result.pk, self.label(result)
            if self.singleton:
                object_id = None
            if action == Action.CHANGED and after == before:
                return result
            if callable(words):
                said = words(result) if result is not None else ""
            else:
                said = words if words is not None else self.words(action, before, after)
            SettingChange.objects.create(
                kind=self.kind,
                object_id=object_id,
                object_label=label[:200],
                action=action,
                before=before,
                after=after,
                words=said,
                via=via,
                by=account_acting(user),
            )
        if self.invalidates:
            # This process sees its own edit at once; the others within the cache TTL.
            transaction.on_commit(policy_cache().invalidate)
        return result

    def changes(self, object_id: int | None) -> models.QuerySet[SettingChange]:
        """The history of one object of the kind (of the kind's singleton: None), newest
        first."""
        return SettingChange.objects.filter(kind=self.kind, object_id=object_id)


def deleted(row: Any) -> None:
    """A `change` that deletes the row."""
    row.delete()


@dataclass(frozen=True, eq=False, kw_only=True)
class AuthoredKind(SettingKind[RowT], Generic[RowT, FieldsT]):
    noun: str  # "rule", "quiet hours": in messages
    fields: type[FieldsT]
    read: Callable[[RowT], FieldsT]  # a stored row's fields: the base of a partial change
    problems: Callable[..., dict[str, list[str]]]  # (fields, *, segments): by field
    apply: Callable[[RowT, FieldsT, Segment | None], None]
    # Words: a record (as_json's shape) read out, and one field's value in a change line.
    describe: Callable[[dict[str, Any], Names], str]
    value_words: Callable[[str, Any, Names], str]
    shown: tuple[tuple[str, str], ...]  # (field, its name in words) a change line names, in order
    # Raises a Conflict before a row is changed or deleted when it must not be (a classic
    # cap's rule: it changes with its cap).
    guard: Callable[[RowT], None] = _no_guard

    def words(self, action: str, before: Any, after: Any) -> str:
        names = dict(Segment.objects.values_list("slug", "name"))
        return self.change_text(action, before, after, names)

    def find(self, row_id: int) -> RowT | None:
        """The row of that id (with its segment), or None; an id beyond what the database holds
        (a 64-bit column) is no row, not an overflow."""
        if not 0 < row_id <= DATABASE_MAX:
            return None
        rows = self.model._default_manager.all()
        if any(f.name == "segment" for f in self.model._meta.get_fields()):
            rows = rows.select_related("segment")
        return rows.filter(pk=row_id).first()

    # --- writes ---

    def create(self, *, fields: FieldsT, user: Any = None, via: str = "admin") -> RowT:
        segment = self._checked(fields)

        def made(_: RowT | None) -> RowT:
            row = self.model(created_by=account_acting(user), changed_by=account_acting(user))
            self.apply(row, fields, segment)
            row.save()
            return row

        row = self.write(Action.CREATED, locate=lambda: None, change=made, user=user, via=via)
        assert row is not None
        return row

    def update(
        self, *, row: RowT, changes: Mapping[str, Any], user: Any = None, via: str = "admin"
    ) -> RowT:
        """Change some fields (`changes`: names of the kind's fields); checked whole."""
        self.guard(row)
        manager: models.Manager[RowT] = self.model._default_manager

        def changed(locked: RowT | None) -> RowT:
            assert locked is not None
            fields = self.fields(**{**asdict(self.read(locked)), **changes})  # type: ignore[call-overload]
            segment = self._checked(fields)
            before = self.as_json(locked)
            self.apply(locked, fields, segment)
            locked.changed_by = account_acting(user)
            if self.as_json(locked) != before:
                locked.save()
            return locked

        locate = lambda: manager.select_for_update().get(pk=row.pk)  # noqa: E731
        saved = self.write(Action.CHANGED, locate=locate, change=changed, user=user, via=via)
        assert saved is not None
        return saved

    def delete(self, *, row: RowT, user: Any = None, via: str = "admin") -> None:
        self.guard(row)
        self.write(Action.DELETED, locate=lambda: row, change=deleted, user=user, via=via)

    def _checked(self, fields: FieldsT) -> Segment | None:
        """The fields' segment; a ValidationError by field for anything wrong with them."""
        slugs = list(Segment.objects.values_list("slug", flat=True))
        problems = self.problems(fields, segments=slugs)
        if problems:
            raise ValidationError(problems)
        slug = getattr(fields, "segment", None)
        return Segment.objects.get(slug=slug) if slug is not None else None

    # --- words ---

    def change_words(self, change: SettingChange, names: Names) -> str:
        """A history line: what the row became, or which fields changed from what to what.
        `names`: segment names by slug."""
        return self.change_text(change.action, change.before, change.after, names)

    def change_text(self, action: str, before: Any, after: Any, names: Names) -> str:
        """What `change_words` says, from the action and the JSON before and after."""
        if action == Action.CREATED and after:
            return f"Created: {self.describe(after, names)}"
        if action == Action.DELETED:
            return "Deleted."
        before, after = before or {}, after or {}
        # In the kind's own order: PostgreSQL's jsonb keeps a record's keys in an order of its
        # own.
        changed = [
            f"{label}: {self.value_words(key, before.get(key), names)} → "
            f"{self.value_words(key, after.get(key), names)}"
            for key, label in self.shown
            if before.get(key) != after.get(key)
        ]
        return "; ".join(changed) or "Nothing visible changed."
