"""The code's references to documentation point into the repository (#38 item 5).

A `§` number, a `PD-n` decision or a `<name>.md` file the repository does not hold dangles for anyone who
clones it. References to the project's own pages (`docs/<file>.md`, `"Section title"`) must name a page that
exists and, when they quote a title, a heading or bold rule title of that page.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "koordqos"
SUFFIXES = (".py", ".pyi")


DOC_PATH = re.compile(r"docs/[A-Za-z0-9_./-]+\.md")
# a docs path, an optional comma, then one or more quoted titles ("A", "B" and "C")
DOC_TITLES = re.compile(r'(docs/[A-Za-z0-9_./-]+\.md),?\s+((?:"[^"\n]+"(?:,\s*|\s+and\s+)?)+)')
SECTION = re.compile(r"§")
DECISION = re.compile(r"\bPD-\d+\b")
MD_FILE = re.compile(r"(?<![A-Za-z0-9_./-])([A-Za-z0-9_./-]+\.md)\b")
# a wrapped comment or docstring line: newline, indentation, an optional comment marker
CONTINUATION = re.compile(r"\n[ \t]*(?:#+[ \t]?)?")


def _sources() -> list[Path]:
    return sorted(p for p in SRC.rglob("*") if p.suffix in SUFFIXES and p.is_file())


def _rel(path: Path) -> str:
    return path.relative_to(SRC).as_posix()


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
    """The references in `text` (a file at `rel` under src/koordqos) to texts not in the repository."""
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
        if not name.startswith("docs/") and not (ROOT / name).is_file():
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
    found = [
        ref
        for path in _sources()
        for ref in external_references(_rel(path), path.read_text(encoding="utf-8"))
    ]
    assert found == [], 'point these at the project docs (docs/<file>.md, "Section"):\n' + "\n".join(found)


def test_every_named_doc_exists() -> None:
    missing = [r for path in _sources() for r in missing_pages(_rel(path), path.read_text(encoding="utf-8"))]
    assert missing == [], "\n".join(missing)


def test_every_quoted_section_exists() -> None:
    missing = [
        ref
        for path in _sources()
        for ref in missing_titles(_rel(path), path.read_text(encoding="utf-8"))
    ]
    assert missing == [], "\n".join(missing)


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
