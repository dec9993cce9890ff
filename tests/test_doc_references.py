"""The code's references to documentation point into the repository (#38 item 5).

A section-sign number, a `PD-n` decision or a `<name>.md` file the repository does not hold dangles for
anyone who clones it. References to the project's own pages (`docs/<file>.md`, `"Section title"`) must name a
page that exists and, when they quote a title, a heading or bold rule title of that page. Checked: the
package (src/koordqos), the tests, bench/ and tools/; of this file, everything above its examples.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TREES = (ROOT / "src" / "koordqos", ROOT / "tests", ROOT / "bench", ROOT / "tools")
SUFFIXES = (".py", ".pyi", ".go", ".c", ".sh")
THIS = Path(__file__).resolve()
# the line that starts this file's examples, which hold the very references the checks must find
EXAMPLES_HEADING = "# -- what the checks count"


DOC_PATH = re.compile(r"docs/[A-Za-z0-9_./-]+\.md")
# a docs path, an optional comma, then one or more quoted titles ("A", "B" and "C")
DOC_TITLES = re.compile(r'(docs/[A-Za-z0-9_./-]+\.md),?\s+((?:"[^"\n]+"(?:,\s*|\s+and\s+)?)+)')
SECTION = re.compile("\u00a7")
DECISION = re.compile(r"\bPD-\d+\b")
MD_FILE = re.compile(r"(?<![A-Za-z0-9_./-])([A-Za-z0-9_./-]+\.md)\b")
# a page named in code as a path built from parts: `ROOT / "docs" / "<file>.md"`
BUILT_DOCS_PATH = re.compile(r'"docs"\s*/\s*"$')
# a wrapped comment or docstring line: newline, indentation, an optional comment marker
CONTINUATION = re.compile(r"\n[ \t]*(?:#+[ \t]?)?")


def _sources() -> list[Path]:
    return sorted(
        p
        for tree in TREES
        for p in tree.rglob("*")
        if p.suffix in SUFFIXES and p.is_file() and "__pycache__" not in p.parts
    )


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _text(path: Path) -> str:
    """The file's text; of this file, the part above its examples."""
    text = path.read_text(encoding="utf-8")
    if path == THIS:
        head, found, _ = text.partition("\n" + EXAMPLES_HEADING)
        assert found, f"{_rel(path)}: no line {EXAMPLES_HEADING!r}"
        return head
    return text


def _flat(text: str) -> str:
    """The text with wrapped lines joined, so a reference split over two comment lines reads as one."""
    return CONTINUATION.sub(" ", text)


@cache
def _anchors(doc: str) -> frozenset[str]:
    """Headings (whole, and before a parenthesis) and bold rule titles (`**Title.**`) of a docs page."""
    out: set[str] = set()
    for line in (ROOT / doc).read_text(encoding="utf-8").splitlines():
        heading = re.match(r"#+\s+(.*?)\s*$", line)
        if heading:
            text = heading.group(1)
            out.add(text)
            out.add(text.split(" (")[0])
        for bold in re.findall(r"\*\*(.+?)\*\*", line):
            out.add(bold.rstrip("."))
    return frozenset(out)


def external_references(rel: str, text: str) -> list[str]:
    """The references in `text` (a file at `rel`) to texts not in the repository."""
    flat = _flat(text)
    found: list[str] = []
    for m in SECTION.finditer(flat):
        before = flat[max(0, m.start() - 80) : m.start()]
        if not re.search(r"docs/[A-Za-z0-9_./-]+\.md,?\s*$", before):
            found.append(f"{rel}: {flat[max(0, m.start() - 40) : m.end() + 10].strip()!r}")
    for m in DECISION.finditer(flat):
        found.append(f"{rel}: {m.group(0)}")
    for m in MD_FILE.finditer(flat):
        name = m.group(1)
        if name.startswith("docs/") or (ROOT / name).is_file():
            continue
        if (
            BUILT_DOCS_PATH.search(flat[max(0, m.start() - 20) : m.start()])
            and (ROOT / "docs" / name).is_file()
        ):
            continue
        found.append(f"{rel}: {name}")
    return found


def missing_pages(rel: str, text: str) -> list[str]:
    """`docs/<file>.md` paths in `text` that the repository does not hold."""
    return [f"{rel}: {p}" for p in sorted(set(DOC_PATH.findall(_flat(text)))) if not (ROOT / p).is_file()]


def missing_titles(rel: str, text: str) -> list[str]:
    """Quoted section titles after a `docs/<file>.md` path in `text` that the page has no heading for."""
    out = []
    for m in DOC_TITLES.finditer(_flat(text)):
        doc = m.group(1)
        if (ROOT / doc).is_file():
            titles = re.findall(r'"([^"]+)"', m.group(2))
            out += [f'{rel}: {doc}, "{t}"' for t in titles if t not in _anchors(doc)]
    return out


def test_no_reference_to_a_text_outside_the_repository() -> None:
    found = [ref for path in _sources() for ref in external_references(_rel(path), _text(path))]
    assert found == [], 'point these at the project docs (docs/<file>.md, "Section"):\n' + "\n".join(found)


def test_every_named_doc_exists() -> None:
    missing = [ref for path in _sources() for ref in missing_pages(_rel(path), _text(path))]
    assert missing == [], "\n".join(missing)


def test_every_quoted_section_exists() -> None:
    missing = [ref for path in _sources() for ref in missing_titles(_rel(path), _text(path))]
    assert missing == [], "\n".join(missing)


def test_every_tree_is_scanned() -> None:
    scanned = {_rel(p).split("/")[0] for p in _sources()}
    assert scanned == {"src", "tests", "bench", "tools"}
    assert THIS in _sources()
    # of this file only the examples are left out, and they are what the checks would find
    assert external_references("x.py", THIS.read_text(encoding="utf-8"))
    assert external_references("x.py", _text(THIS)) == []


# -- what the checks count (examples: the references below are the cases, so the scan stops above) ---------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("# the quota (runtime-hooks.md §3.1)", 2),  # the external file and its section
        ('"""Shares (qos-manager.md\n§2.5)."""', 2),  # split over two lines
        ("# a bare §2.3 and spec §4", 2),
        ("# the PD-5 rule", 1),
        ("# docs/deployment.md §2.2 is the project's own", 0),
        ('# docs/reporting.md, "Zones"', 0),
        ("# see README.md", 0),  # a file of the repository
        ('page = ROOT / "docs" / "deployment.md"', 0),  # a docs page as a path built in code
        ('page = ROOT / "docs" / "no-such-page.md"', 1),
        ('page = ROOT / "deployment.md"', 1),  # not a docs page
    ],
)
def test_what_counts_as_an_external_reference(text: str, expected: int) -> None:
    assert len(external_references("x.py", text)) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('# (docs/reporting.md, "Zones", "NRT writes")', 0),
        ('# (docs/reporting.md, "Zones and\n# more")', 1),  # no such title, even wrapped
        ('# (docs/prediction.md, "Restore", "Expiry" and "Checkpoints")', 0),
        ("# (docs/no-such-page.md)", 1),
        ('# (docs/behaviour-qos-manager.md, "CPU\n    # suppress")', 0),  # a title wrapped over two lines
    ],
)
def test_what_counts_as_a_missing_doc(text: str, expected: int) -> None:
    assert len(missing_pages("x.py", text) + missing_titles("x.py", text)) == expected
