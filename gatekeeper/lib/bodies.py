"""JSON request bodies: read within a size limit, decoded by msgspec into a declared type, and
every problem answered as a 400 that names the field (`requests[3].user_id`).

Each endpoint declares its body as a `Body` struct (a view's `bodies`). msgspec decodes and
checks it in one pass in C (types, lengths, bounds, enumerations; 10,000 gate requests in about
three milliseconds), and the OpenAPI schema is generated from the same struct
(`openapi_components`, used by gatekeeper.lib.api's schema class), so the server and its schema
cannot drift apart.

Limits on what a caller sends, the same on every endpoint (docs/api.md, "Errors"):
- size: the view's `max_body_bytes`; beyond it a JSON 413 that states the limit, before the
  body is read;
- nesting: at most MAX_DEPTH levels of arrays and objects (the typed parts of a body are
  shallower by construction; free-form values such as a send's `context` are walked, to that
  depth and no further);
- strings: valid Unicode (a lone surrogate such as "\\ud800" is valid JSON but cannot be stored
  or sent as UTF-8) and no NUL character (PostgreSQL text cannot hold it).
"""

import json
import re
from collections.abc import Callable, Iterator
from datetime import datetime
from functools import cache
from typing import Any, TypeVar

import msgspec
import msgspec.inspect as mi
from rest_framework.exceptions import APIException, ParseError, ValidationError
from rest_framework.parsers import BaseParser

MAX_DEPTH = 32
DEFAULT_MAX_BODY_BYTES = 1 * 2**20
NON_FIELD = "non_field_errors"

B = TypeVar("B", bound="Body")


class Body(msgspec.Struct, forbid_unknown_fields=True):
    """A request body. Unknown fields are refused: a misspelt `dry_run` must not quietly record
    real sends. Subclasses are declared `kw_only=True` (msgspec does not inherit it), so the
    fields can be listed in the order a reader expects, required ones after optional ones."""


class RequestTooLarge(APIException):
    status_code = 413
    default_code = "request_too_large"

    def __init__(self, *, limit: int, size: int | None = None, reason: str = "") -> None:
        size_text = f"The body is {size:,} bytes; " if size is not None else "The body is larger: "
        reason_text = f" ({reason})" if reason else ""
        super().__init__(f"{size_text}this endpoint takes at most {limit:,} bytes{reason_text}.")


def declared_size_checked(request: Any, *, limit: int, reason: str) -> None:
    """Refuse (413) a body whose Content-Length says it is larger than `limit`, before a byte
    of it is read; `reason` names the setting or limit."""
    declared = request.META.get("CONTENT_LENGTH") if request is not None else None
    if declared and declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise RequestTooLarge(limit=limit, size=int(declared), reason=reason)


class JsonBodyParser(BaseParser):
    """Hands the view the body as bytes, read only up to the view's `max_body_bytes`: a body
    above it is refused from its Content-Length before a byte is read, and one that lies about
    its length is cut off one byte past the limit."""

    media_type = "application/json"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        context = parser_context or {}
        view = context.get("view")
        limit = int(getattr(view, "max_body_bytes", DEFAULT_MAX_BODY_BYTES))
        reason = str(getattr(view, "body_limit_reason", ""))
        request = context.get("request")
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0) if request is not None else 0
        except ValueError:
            declared = 0
        if declared > limit:
            raise RequestTooLarge(limit=limit, size=declared, reason=reason)
        data = stream.read(limit + 1)
        if len(data) > limit:
            raise RequestTooLarge(limit=limit, reason=reason)
        return bytes(data)


@cache
def _decoder(spec: type[B]) -> msgspec.json.Decoder[B]:
    return msgspec.json.Decoder(spec)


def decode(data: Any, spec: type[B]) -> B:
    """The body (`request.data` as JsonBodyParser left it) as a `spec`; ValidationError (a 400
    naming the field) for anything wrong with it, ParseError for JSON that is not JSON."""
    raw = bytes(data) if isinstance(data, bytes | bytearray) else b""
    if not raw.strip():
        raise ValidationError({NON_FIELD: ["The body is empty: send a JSON object."]})
    try:
        body = _decoder(spec).decode(raw)
    except msgspec.ValidationError as exc:
        raise ValidationError(_field_errors(spec, raw, str(exc))) from None
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise _undecodable(raw, str(exc)) from None
    except RecursionError:
        raise ValidationError({NON_FIELD: [_too_deep()]}) from None
    free = _free_form_paths(spec)
    if free:
        deep = _first_too_deep(body, free)
        if deep is not None:
            raise ValidationError({deep: [_too_deep()]})
    # NUL can only arrive escaped (JSON forbids raw control characters in strings), so its
    # absence is one byte search; its presence (rare) costs a walk to name the field.
    if b"\\u0000" in raw:
        where = _first_string(body, lambda s: "\x00" in s)
        if where is not None:
            raise ValidationError(
                {where or NON_FIELD: ["Must not contain the NUL character (\\u0000)."]}
            )
    return body


def _too_deep() -> str:
    return f"Nested deeper than {MAX_DEPTH} levels of arrays and objects (the body counts as one)."


# --- errors ---------------------------------------------------------------------------------

_AT = re.compile(r"^(?P<message>.*?)(?: - at `\$(?P<path>.*)`)?$", re.S)
_KINDS = {
    "int": "an integer",
    "str": "a string",
    "bool": "true or false",
    "float": "a number with a fraction",
    "null": "null",
    "object": "an object",
    "array": "a list",
    "datetime": "a date and time",
}
DATETIME_WORDS = "An ISO 8601 date and time with its UTC offset: 2026-06-11T09:00:00+02:00 (or Z)."


def datetime_from_text(text: str) -> datetime:
    """A date and time as ISO 8601 text, as it is when it has no UTC offset (the caller refuses
    that in its own words); ValueError naming the text when it is no date and time."""
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text[:40]!r} is not a date and time. {DATETIME_WORDS}") from None


# What a pattern means, in words, for the patterns the bodies use (see `words_for_pattern`).
_PATTERN_WORDS: dict[str, str] = {}


def words_for_pattern(pattern: str, words: str) -> str:
    """Register how a refused string of `pattern` is explained; returns the pattern."""
    _PATTERN_WORDS[pattern] = words
    return pattern


def _kind(name: str) -> str:
    return " or ".join(_KINDS.get(part.strip(), part.strip()) for part in name.split("|"))


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _field_errors(spec: type, raw: bytes, text: str) -> dict[str, list[str]]:
    found = _AT.match(text)
    message = found["message"] if found else text
    path = (found["path"] or "").lstrip(".") if found else ""
    field = path or NON_FIELD
    if m := re.fullmatch(r"Object missing required field `(.+)`", message):
        return {_join(path, m[1]): ["This field is required."]}
    if m := re.fullmatch(r"Object contains unknown field `(.+)`", message):
        known = _struct_fields(_type_at(spec, path), _value_at(raw, path))
        takes = f" Known fields: {', '.join(known)}." if known else ""
        return {_join(path, m[1]): [f"Unknown field.{takes}"]}
    if m := re.fullmatch(r"Expected `(.+?)`, got `(.+?)`", message):
        if not path and m[1] == "object":
            return {NON_FIELD: ["The body must be a JSON object."]}
        return {field: [f"Must be {_kind(m[1])}, not {_kind(m[2])}."]}
    if m := re.fullmatch(r"Expected `([a-z|]+)`", message):
        return {field: [f"Must be {_kind(m[1])}."]}
    if m := re.fullmatch(r"Expected `(?:int|float)` (>=|<=|>|<) (\S+)", message):
        words = {">=": "at least", "<=": "at most", ">": "more than", "<": "less than"}[m[1]]
        bound = float(m[2])  # an int's bound, or a float's (1000000000000.0, 1e+300)
        shown = f"{int(bound):,}" if bound.is_integer() and abs(bound) < 1e18 else m[2]
        return {field: [f"Must be {words} {shown}."]}
    if m := re.fullmatch(r"Expected `str` of length (>=|<=) (\d+)", message):
        limit = int(m[2])
        if m[1] == ">=":
            return {
                field: ["Must not be empty." if limit == 1 else f"At least {limit} characters."]
            }
        return {field: [f"At most {limit:,} characters."]}
    if m := re.fullmatch(r"Expected `(?:array|object)` of length (>=|<=) (\d+)", message):
        limit = int(m[2])
        if m[1] == ">=":
            return {field: ["Must not be empty." if limit == 1 else f"At least {limit:,} items."]}
        count = _count_at(raw, path)
        has = f"; this one has {count:,}" if count is not None else ""
        return {field: [f"At most {limit:,} items per request{has}."]}
    if m := re.fullmatch(r"Expected `str` matching regex '(.+)'", message):
        # msgspec shows the pattern with its backslashes doubled.
        pattern = m[1].replace("\\\\", "\\")
        return {field: [_PATTERN_WORDS.get(pattern, "Does not have the expected form.")]}
    if message.startswith("Invalid RFC3339 encoded datetime"):
        return {field: [f"Not a date and time. {DATETIME_WORDS}"]}
    if m := re.fullmatch(r"Invalid enum value (.+)", message):
        choices = _choices(_type_at(spec, path))
        listed = f"Choose one of: {', '.join(str(c) for c in choices)}" if choices else "Unknown"
        return {field: [f"{listed} (not {m[1]})."]}
    if m := re.fullmatch(r"Invalid value (.+)", message):
        # The tag of a tagged union (`window.kind`): the choices are its options' tags.
        tags = _tags(_type_at(spec, path.rpartition(".")[0]))
        listed = f"Choose one of: {', '.join(tags)}" if tags else "Unknown"
        return {field: [f"{listed} (not {m[1]})."]}
    return {field: [message]}


def _undecodable(raw: bytes, text: str) -> Exception:
    """Why a body msgspec could not read is unreadable, in the caller's terms: not UTF-8, not
    JSON, too deep, or (valid JSON that Python reads) a string holding a lone surrogate."""
    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return ParseError(f"JSON parse error - the body is not UTF-8 (byte {exc.start}).")
    try:
        generic = json.loads(decoded)
    except RecursionError:
        return ValidationError({NON_FIELD: [_too_deep()]})
    except ValueError as exc:
        return ParseError(f"JSON parse error - {exc}")
    where = _first_string(generic, _has_lone_surrogate)
    if where is not None:
        return ValidationError(
            {
                where or NON_FIELD: [
                    "Must be valid Unicode: holds a lone surrogate (\\ud800-\\udfff), which "
                    "cannot be encoded."
                ]
            }
        )
    return ParseError(f"JSON parse error - {text}")


def _has_lone_surrogate(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


# --- walking decoded bodies (bounded: never deeper than MAX_DEPTH + 1) ------------------------


def _children(value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, msgspec.Struct):
        for name in value.__struct_fields__:
            yield f".{name}", getattr(value, name)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield f".{key}", key  # keys are strings too
            yield f".{key}", item
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield f"[{i}]", item


def _first_string(value: Any, bad: Any, path: str = "", depth: int = 0) -> str | None:
    """The path of the first string for which `bad` holds (`""` for the body itself)."""
    if isinstance(value, str):
        return path.lstrip(".") if bad(value) else None
    if depth > MAX_DEPTH:
        return None
    for step, item in _children(value):
        found = _first_string(item, bad, path + step, depth + 1)
        if found is not None:
            return found
    return None


def _nested(value: Any) -> bool:
    return isinstance(value, dict | list | tuple | msgspec.Struct)


def _first_too_deep(body: Any, free: tuple[tuple[str, ...], ...]) -> str | None:
    """The first free-form field (by `free`: field-name paths into the struct, lists crossed
    on the way) holding values nested beyond MAX_DEPTH, counted from the body."""
    for names in free:
        for path, value, depth in _along(body, names, "", 1):
            if _nested(value) and _depth_exceeds(value, MAX_DEPTH - depth):
                return path.lstrip(".")
    return None


def _along(value: Any, names: tuple[str, ...], path: str, depth: int) -> Iterator[Any]:
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _along(item, names, f"{path}[{i}]", depth + 1)
        return
    if not names:
        yield path, value, depth
        return
    if isinstance(value, msgspec.Struct):
        yield from _along(getattr(value, names[0]), names[1:], f"{path}.{names[0]}", depth + 1)


def _depth_exceeds(value: Any, budget: int) -> bool:
    """True when `value` nests more than `budget` further levels of arrays and objects."""
    if budget < 0:
        return True
    items = value.values() if isinstance(value, dict) else value
    return any(_nested(item) and _depth_exceeds(item, budget - 1) for item in items)


# --- what the declared types say ----------------------------------------------------------------


def _bare(info: Any) -> Any:
    """The type without its Meta annotations (descriptions, examples)."""
    while isinstance(info, mi.Metadata):
        info = info.type
    return info


def _type_at(spec: type, path: str) -> Any:
    """The msgspec.inspect type at `path` (`requests[3].user_id`) in `spec`, or None."""
    current: Any = mi.type_info(spec)
    for part in re.findall(r"\.?([A-Za-z_][A-Za-z0-9_]*)|\[\d+\]", path):
        current = _bare(current)
        while isinstance(current, mi.UnionType | mi.ListType):
            if isinstance(current, mi.ListType):
                current = _bare(current.item_type)
            else:
                options = [_bare(t) for t in current.types]
                structs = [t for t in options if isinstance(t, mi.StructType | mi.ListType)]
                # Of a tagged union's options, the one that has the field.
                having = [t for t in structs if part in _struct_fields(t)]
                current = (having or structs)[0] if structs else None
        if not part:
            continue
        if not isinstance(current, mi.StructType):
            return None
        current = next((f.type for f in current.fields if f.encode_name == part), None)
    current = _bare(current)
    while isinstance(current, mi.ListType):
        current = _bare(current.item_type)
    return current


def _struct_fields(info: Any, value: Any = None) -> list[str]:
    """The fields of a struct; of a tagged union, those of the option `value`'s tag names."""
    info = _bare(info)
    if isinstance(info, mi.UnionType):
        options = [_bare(t) for t in info.types]
        tagged = [t for t in options if isinstance(t, mi.StructType) and t.tag_field]
        info = next(
            (t for t in tagged if isinstance(value, dict) and value.get(t.tag_field) == t.tag),
            None,
        )
    if not isinstance(info, mi.StructType):
        return []
    own = [f.encode_name for f in info.fields]
    return [info.tag_field, *own] if info.tag_field else own


def _tags(info: Any) -> list[str]:
    info = _bare(info)
    if not isinstance(info, mi.UnionType):
        return []
    options = [_bare(t) for t in info.types]
    return [str(t.tag) for t in options if isinstance(t, mi.StructType) and t.tag_field]


def _choices(info: Any) -> list[Any]:
    info = _bare(info)
    if isinstance(info, mi.LiteralType):
        return list(info.values)
    if isinstance(info, mi.UnionType):
        return [v for t in info.types for v in _choices(t)]
    return []


def _value_at(raw: bytes, path: str) -> Any:
    """The JSON value at `path`, or None (error path only: decodes the body again)."""
    try:
        value: Any = msgspec.json.decode(raw)
        for name, index in re.findall(r"\.?([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]", path):
            value = value[name] if name else value[int(index)]
        return value
    except Exception:
        return None


def _count_at(raw: bytes, path: str) -> int | None:
    """How many items the list at `path` has."""
    value = _value_at(raw, path)
    return len(value) if isinstance(value, list | dict) else None


@cache
def _free_form_paths(spec: type) -> tuple[tuple[str, ...], ...]:
    """Paths (field names; lists crossed silently) to the values typed Any in `spec`."""
    found: list[tuple[str, ...]] = []

    def visit(info: Any, names: tuple[str, ...], seen: frozenset[type]) -> None:
        info = _bare(info)
        if isinstance(info, mi.AnyType | mi.DictType):
            found.append(names)
        elif isinstance(info, mi.ListType):
            visit(info.item_type, names, seen)
        elif isinstance(info, mi.UnionType):
            for t in info.types:
                visit(t, names, seen)
        elif isinstance(info, mi.StructType) and info.cls not in seen:
            for f in info.fields:
                visit(f.type, (*names, f.name), seen | {info.cls})

    visit(mi.type_info(spec), (), frozenset())
    return tuple(dict.fromkeys(found))


# --- the OpenAPI schema -----------------------------------------------------------------------

REF = "#/components/schemas/{name}"
# Every string of a body is refused with a NUL in it (PostgreSQL text cannot hold it).
NO_NUL = "^[^\\u0000]*$"
# A text with something in it: a character that is not white space (nor a NUL). The white space
# is listed, not written `\s`: Python's (msgspec's check, `str.strip` in the rules) and a JSON
# Schema reader's (ECMA-262) differ, and the schema must say exactly what is refused.
_SPACE = r"\t\n\x0b\x0c\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
NOT_BLANK = words_for_pattern(
    rf"^[^\u0000]*[^{_SPACE}\u0000][^\u0000]*$", "Must not be blank (nor hold a NUL)."
)
# Values whose bounds are settings (the configured channels, the widest user id): a body type
# marks them (`Meta(extra_json_schema=schema_fill(...))`) and the schema asks at generation.
_FILLS: dict[str, Callable[[], dict[str, Any]]] = {}


def schema_fill(name: str, fill: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Register `fill`, which gives the schema of a value marked `name` as settings have it;
    returns the mark to put in the type's `Meta(extra_json_schema=...)`."""
    _FILLS[name] = fill
    return {"x-fill": name}


def openapi_components(spec: type) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(the schema of a body of `spec`: a `$ref`, or a union of them; the component schemas it
    refers to, by name), in OpenAPI 3.0 form: msgspec's JSON Schema with `anyOf [X, null]`
    written in a form that takes null in OpenAPI 3.0.3 (`nullable_schema`), a tagged union as
    `oneOf` with its discriminator, marked values filled from settings, and every plain string
    refusing NUL, as the server does."""
    (ref,), components = msgspec.json.schema_components((spec,), ref_template=REF)
    return _openapi(ref), {name: _openapi(node) for name, node in components.items()}


def _openapi(node: Any) -> Any:
    if isinstance(node, list):
        return [_openapi(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: _openapi(value) for key, value in node.items() if key != "title"}
    if "discriminator" in node and "anyOf" in node:
        # The options of a tagged union exclude each other (each has its own tag): one of them.
        node["oneOf"] = node.pop("anyOf")
    if node.get("required") == []:
        del node["required"]  # OpenAPI 3.0 wants none rather than an empty list
    for exclusive, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        value = node.get(exclusive)
        if isinstance(value, int | float) and not isinstance(value, bool):
            # JSON Schema's number (msgspec's `gt`, `lt`) as OpenAPI 3.0's bound and flag.
            node[bound], node[exclusive] = value, True
    fill = node.pop("x-fill", None)
    if fill is not None:
        kept = {key: node[key] for key in ("description", "default") if key in node}
        node = {**_FILLS[fill](), **kept}
    options = node.get("anyOf")
    if options and {"type": "null"} in options:
        rest = [option for option in options if option != {"type": "null"}]
        node.pop("anyOf")
        node.update(rest[0] if len(rest) == 1 else {"anyOf": rest})
        node = nullable_schema(node)
    if node.get("type") == "string" and not {"pattern", "enum", "format"} & set(node):
        node["pattern"] = NO_NUL
    return node


# --- null in OpenAPI 3.0.3 ----------------------------------------------------------------------
#
# OpenAPI 3.0.3 has no null type: `nullable: true` adds null to the `type` beside it, and only to
# it ("only if type is explicitly defined within the same Schema Object"). Beside no `type` it
# does nothing; and it cannot loosen what an `allOf`, `oneOf` or `anyOf` beside it or a `$ref`
# requires, each of which keeps its veto. So `{"allOf": [{"$ref": Rule}], "nullable": true}`
# (drf-spectacular's form for a nullable nested serializer) refuses null, and so does the same
# with `type: object` added: the referenced schema is an object and null is not one. A client
# that validates answers by the specification rejects every null sent for it.
#
# What takes null in 3.0.3 for a reference (or any combination) is a choice between it and a
# schema that takes only null: {"oneOf": [{"$ref": Rule}, NULL]}. `nullable_schema` makes that
# form; gatekeeper.lib.api's schema hook puts every nullable of the served document through it,
# and the struct converter above does the same, so no nullable can come out in another form.

# Null and nothing else: typed, so that `nullable` counts, and `enum` leaves only null.
NULL: dict[str, Any] = {"type": "object", "nullable": True, "enum": [None]}
_APPLICATORS = ("allOf", "oneOf", "anyOf")
# Keys that say what a value is for, not what it must be: kept beside the choice.
_DESCRIPTIVE = frozenset(
    {"title", "description", "default", "example", "readOnly", "writeOnly", "deprecated"}
)


def nullable_schema(
    schema: dict[str, Any], resolve: Callable[[str], dict[str, Any] | None] | None = None
) -> dict[str, Any]:
    """`schema` (marked `nullable: true`, or not) also taking null, in a form OpenAPI 3.0.3
    honours: `nullable` beside the `type` it widens (null added to an `enum` beside it), or, for
    a `$ref` or an `allOf`/`oneOf`/`anyOf`, typed or not, a `oneOf` between it and NULL; its
    descriptive keys (description, readOnly, default, ...) stay beside it. `resolve` gives a
    component's schema by its `$ref`, so that an option already taking null is not doubled (a
    `oneOf` would then match null twice)."""
    node = {key: value for key, value in schema.items() if key != "nullable"}
    if "$ref" in node:
        node["allOf"] = [{"$ref": node.pop("$ref")}]
    if not any(key in node for key in _APPLICATORS):
        widened = {**schema, "nullable": True} if "type" in schema else node
        if "enum" in widened and None not in widened["enum"]:
            widened["enum"] = [*widened["enum"], None]
        # Typed: `nullable` adds null to the type. Untyped: every value is taken, null too.
        return widened
    if _takes_null({**node, "nullable": True}, resolve):
        return {**schema, "nullable": True} if "type" in node else node
    described = {key: node.pop(key) for key in list(node) if key in _DESCRIPTIVE}
    if set(node) == {"oneOf"}:
        # A plain choice: null is one more option.
        return {**described, "oneOf": [*node["oneOf"], NULL]}
    if set(node) == {"allOf"} and len(node["allOf"]) == 1:
        node = node["allOf"][0]  # a lone reference as itself
    return {**described, "oneOf": [node, NULL]}


def _takes_null(
    schema: Any, resolve: Callable[[str], dict[str, Any] | None] | None, depth: int = 0
) -> bool:
    """Whether null is valid against `schema` in OpenAPI 3.0.3 (references followed by
    `resolve`; False when one cannot be)."""
    if not isinstance(schema, dict) or depth > 32:
        return False
    if "$ref" in schema:
        target = resolve(schema["$ref"]) if resolve is not None else None
        return target is not None and _takes_null(target, resolve, depth + 1)
    if "type" in schema and schema.get("nullable") is not True:
        return False
    if "enum" in schema and None not in schema["enum"]:
        return False
    if not all(_takes_null(option, resolve, depth + 1) for option in schema.get("allOf", [])):
        return False
    return all(
        any(_takes_null(option, resolve, depth + 1) for option in schema[key])
        for key in ("oneOf", "anyOf")
        if key in schema
    )


def json_value_problem(value: Any, *, max_depth: int) -> str | None:
    """Why a free-form JSON value (a send's template context) cannot be stored or rendered, in
    words, or None: nested deeper than `max_depth` levels (the value itself is the first), a NUL
    character, or a lone surrogate in a key or a string. An explicit stack: never recurses."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return "Must not contain the NUL character (\\u0000)."
            if _has_lone_surrogate(item):
                return "Must be valid Unicode: holds a lone surrogate, which cannot be encoded."
        elif isinstance(item, dict | list):
            if depth > max_depth:
                return f"Nested deeper than {max_depth} levels of arrays and objects."
            if isinstance(item, dict):
                stack.extend((key, depth) for key in item)
                stack.extend((v, depth + 1) for v in item.values())
            else:
                stack.extend((v, depth + 1) for v in item)
    return None
