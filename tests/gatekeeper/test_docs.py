"""The docs name only what exists: every path of the project's own files that README.md and
docs/*.md give (tests/...py, docs/...md, a module, a script, a unit file) is there, and every
`tests/<file>.py::<name>` names a test of that file."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
TOP = "tests|docs|limits|worker|segments|gatekeeper|scripts|bench|deploy|locale|templates"
KINDS = "py|md|lua|json|yml|yaml|txt|html|sh|service|toml|cfg|ini|rules|po"
# A path starts a word (not the tail of another path or of a URL) and ends in a known suffix;
# `::name` after it names something in the file.
PATH = re.compile(rf"(?<![\w./-])((?:{TOP})/[\w./-]*?\w\.(?:{KINDS}))\b(?:::(\w+))?")


def named_paths(text: str) -> list[tuple[str, str | None]]:
    return [(m.group(1), m.group(2)) for m in PATH.finditer(text)]


def test_the_pattern_finds_what_docs_write():
    text = (
        "see `tests/worker/test_gate.py::test_one`, docs/ledger.md and limits/engine/lua/limiter.lua; "
        "not https://example.com/docs/x.md nor var/tests/x.py"
    )
    assert named_paths(text) == [
        ("tests/worker/test_gate.py", "test_one"),
        ("docs/ledger.md", None),
        ("limits/engine/lua/limiter.lua", None),
    ]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_path_a_doc_names_exists(doc: Path):
    missing = []
    for path, name in named_paths(doc.read_text(encoding="utf-8")):
        target = ROOT / path
        if not target.exists():
            missing.append(path)
        elif name is not None and not re.search(
            rf"\b(def|class) {re.escape(name)}\b", target.read_text(encoding="utf-8")
        ):
            missing.append(f"{path}::{name}")
    assert not missing, f"{doc.relative_to(ROOT)} names what does not exist: {missing}"
