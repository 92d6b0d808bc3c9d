"""The one stack for authored records: rows a marketer writes (cap rules, quiet hours, topics,
and the kinds to come), each change checked whole, recorded with who made it and through what, and in
force in every process within GATEKEEPER_CAPS_TTL_SECONDS.

A kind is a spec (`AuthoredKind`): its model and change model, its editable fields (a dataclass
named as the model's fields, the segment as its slug), the one rule for a valid record (problems
by field, named as the REST API names them), how a row reads as fields and as JSON (the REST
API's shape, which the history keeps), how fields are put on a row, and how a change reads in
words. `create`, `update` and `delete` are written once, here:

- the row is locked and the changes are applied to it as it is now, not as the caller read it,
  so two changes of different fields at once both stay;
- the result is checked whole (a ValidationError by field: the REST API's 400, the admin form's
  errors);
- a change record (before, after, who, via, its label) is written in the same transaction, and
  a change that changes nothing writes nothing;
- the process's cache of rules is dropped once the transaction commits (the others follow
  within the cache's TTL).
"""

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Generic, Protocol, TypeVar

from django.core.exceptions import ValidationError
from django.db import models, transaction

from gatekeeper.lib.ids import DATABASE_MAX
from limits.models.policy import Authored, ChangeRecord
from limits.policy.selectors import policy_cache
from segments.models import Segment


class Fields(Protocol):
    """A kind's editable fields (a dataclass). A kind whose rows apply to a segment names it
    `segment` (a slug; None: every one); a kind without one (topics) has no such field."""


RowT = TypeVar("RowT", bound=Authored)
FieldsT = TypeVar("FieldsT", bound=Fields)
Names = Mapping[str, str]  # segment names by slug


def who(user: Any) -> Any:
    """The user to record: None for nobody known (a command, an anonymous caller)."""
    return user if user is not None and getattr(user, "is_authenticated", False) else None


def _no_guard(row: Any) -> None:
    return None


@dataclass(frozen=True, eq=False)
class AuthoredKind(Generic[RowT, FieldsT]):
    noun: str  # "rule", "quiet hours": in messages
    model: type[RowT]
    change_model: type[ChangeRecord]
    link: str  # the change model's foreign key to the row
    fields: type[FieldsT]
    read: Callable[[RowT], FieldsT]  # a stored row's fields: the base of a partial change
    problems: Callable[..., dict[str, list[str]]]  # (fields, *, segments): by field
    apply: Callable[[RowT, FieldsT, Segment | None], None]
    as_json: Callable[[RowT], dict[str, Any]]
    # Words: a record (as_json's shape) read out, and one field's value in a change line.
    describe: Callable[[dict[str, Any], Names], str]
    value_words: Callable[[str, Any, Names], str]
    shown: tuple[tuple[str, str], ...]  # (field, its name in words) a change line names, in order
    # Raises a Conflict before a row is changed or deleted when it must not be (a classic
    # cap's rule: it changes with its cap).
    guard: Callable[[RowT], None] = _no_guard

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
        with transaction.atomic():
            row = self.model(created_by=who(user), changed_by=who(user))
            self.apply(row, fields, segment)
            row.save()
            self._record(row, ChangeRecord.Action.CREATED, None, self.as_json(row), user, via)
        transaction.on_commit(policy_cache().invalidate)
        return row

    def update(
        self, *, row: RowT, changes: Mapping[str, Any], user: Any = None, via: str = "admin"
    ) -> RowT:
        """Change some fields (`changes`: names of the kind's fields); checked whole."""
        self.guard(row)
        with transaction.atomic():
            manager: models.Manager[RowT] = self.model._default_manager
            locked = manager.select_for_update().get(pk=row.pk)
            fields = self.fields(**{**asdict(self.read(locked)), **changes})  # type: ignore[call-overload]
            segment = self._checked(fields)
            before = self.as_json(locked)
            self.apply(locked, fields, segment)
            locked.changed_by = who(user)
            after = self.as_json(locked)
            if after != before:
                locked.save()
                self._record(locked, ChangeRecord.Action.CHANGED, before, after, user, via)
        transaction.on_commit(policy_cache().invalidate)
        return locked

    def delete(self, *, row: RowT, user: Any = None, via: str = "admin") -> None:
        self.guard(row)
        with transaction.atomic():
            self._record(row, ChangeRecord.Action.DELETED, self.as_json(row), None, user, via)
            row.delete()
        transaction.on_commit(policy_cache().invalidate)

    def record(self, row: RowT, action: str, before: Any, after: Any, user: Any, via: str) -> None:
        """Write a change record of `row` (for writes made outside create/update/delete, in
        their transaction: a classic cap's rules changing with their cap)."""
        self._record(row, action, before, after, user, via)

    def _checked(self, fields: FieldsT) -> Segment | None:
        """The fields' segment; a ValidationError by field for anything wrong with them."""
        slugs = list(Segment.objects.values_list("slug", flat=True))
        problems = self.problems(fields, segments=slugs)
        if problems:
            raise ValidationError(problems)
        slug = getattr(fields, "segment", None)
        return Segment.objects.get(slug=slug) if slug is not None else None

    def _record(self, row: RowT, action: str, before: Any, after: Any, user: Any, via: str) -> None:
        self.change_model._default_manager.create(
            **{self.link: row if action != ChangeRecord.Action.DELETED else None},
            label=str(row)[:100],  # what it read as
            action=action,
            before=before,
            after=after,
            changed_by=who(user),
            via=via,
        )

    # --- words ---

    def change_words(self, change: ChangeRecord, names: Names) -> str:
        """A history line: what the row became, or which fields changed from what to what.
        `names`: segment names by slug."""
        if change.action == ChangeRecord.Action.CREATED and change.after:
            return f"Created: {self.describe(change.after, names)}"
        if change.action == ChangeRecord.Action.DELETED:
            return "Deleted."
        before, after = change.before or {}, change.after or {}
        # In the kind's own order: PostgreSQL's jsonb keeps a record's keys in an order of its
        # own.
        changed = [
            f"{label}: {self.value_words(key, before.get(key), names)} → "
            f"{self.value_words(key, after.get(key), names)}"
            for key, label in self.shown
            if before.get(key) != after.get(key)
        ]
        return "; ".join(changed) or "Nothing visible changed."
