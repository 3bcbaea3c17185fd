"""The repository explains itself (docs/architecture.md, "Rules we keep", rule 8).

Three checks over the checkout's own text files: no file cites a document outside the repository (the
reference specs and notes a development session had beside the checkout, or their section signs); every
pointer to a page and a heading (``docs/protocol.md, "Fit"``) names an existing one; every link between
pages of ``docs/`` (and from the README) lands on an existing file and, with ``#anchor``, on an existing
heading. So a pointer cannot rot when a page or heading is renamed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

#: What is read: the sources, the chart, the docs and the build files; not virtual environments, caches,
#: build output or checkouts of other projects (hidden folders, ``.gpu-deps`` included).
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".tpl", ".toml", ".txt", ".sh", ".proto", ".json", ".cfg", ".ini"}
NAMES = {"Makefile", "Dockerfile"}
SKIPPED_DIRS = {"__pycache__", "build", "dist", "node_modules"}

#: Names of documents that are not in the repository (built from parts, so this file does not match).
OUTSIDE = tuple(
    "".join(parts)
    for parts in (
        ("spec-", "scheduler"),
        ("spec-", "node-chart"),
        ("testing-", "here"),
        ("users", ".md"),
        ("fgd", ".md"),
        ("shared/", "docs"),
        ("\u00a7",),  # a section sign: how those documents were cited
    )
)

POINTER = re.compile(r'docs/([\w.-]+\.md), ((?:"[^"\n]+"(?:, )?)+)')
QUOTED = re.compile(r'"([^"\n]+)"')
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def text_files() -> Iterator[Path]:
    """Every text file of the checkout that a maintainer reads."""
    for path in sorted(ROOT.rglob("*")):
        parts = path.relative_to(ROOT).parts
        if any(p.startswith(".") and p not in {".ci", ".github"} for p in parts):
            continue
        if any(p in SKIPPED_DIRS or p.endswith(".egg-info") for p in parts):
            continue
        if path.is_file() and (path.suffix in SUFFIXES or path.name in NAMES):
            yield path


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def without_code_blocks(text: str) -> str:
    """The markdown text with fenced code blocks blanked (links there are not links)."""
    out, fenced = [], False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            out.append("")
        else:
            out.append("" if fenced else line)
    return "\n".join(out)


def headings(page: Path) -> list[str]:
    """The heading texts of a markdown page, outside code blocks."""
    found = []
    for line in without_code_blocks(read(page)).split("\n"):
        match = HEADING.match(line)
        if match:
            found.append(match.group(2))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor of a page, repeated headings numbered as GitHub does (``x``, ``x-1``, ...)."""
    seen: dict[str, int] = {}
    result = set()
    for heading in headings(page):
        base = slug(heading)
        count = seen.get(base, 0)
        result.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return result


def names_heading(page: Path, quoted: str) -> bool:
    """Whether ``quoted`` is a heading of ``page``, or its start before `` (`` or ``:``."""
    for heading in headings(page):
        plain = heading.replace("`", "")
        if plain == quoted or plain.startswith((quoted + " (", quoted + ":")):
            return True
    return False


def test_the_scan_sees_the_repository() -> None:
    files = {path.relative_to(ROOT).as_posix() for path in text_files()}
    assert {"docs/protocol.md", "hami/core/fit.py", "tests/test_docs_links.py", "Makefile"} <= files
    assert not any(name.startswith((".venv/", ".git/")) for name in files)


def test_nothing_cites_documents_outside_the_repository() -> None:
    found = []
    for path in text_files():
        for number, line in enumerate(read(path).split("\n"), 1):
            found += [f"{path.relative_to(ROOT)}:{number}: {word!r}" for word in OUTSIDE if word in line]
    assert not found, "cite docs/ instead:\n" + "\n".join(found)


def test_every_docs_pointer_names_a_page_and_a_heading() -> None:
    broken, count = [], 0
    for path in text_files():
        for number, line in enumerate(read(path).split("\n"), 1):
            for match in POINTER.finditer(line):
                page = DOCS / match.group(1)
                for quoted in QUOTED.findall(match.group(2)):
                    count += 1
                    if not page.is_file() or not names_heading(page, quoted):
                        broken.append(f'{path.relative_to(ROOT)}:{number}: docs/{match.group(1)}, "{quoted}"')
    assert count > 50  # the pointers of the code and the tests are seen
    assert not broken, "no such page or heading:\n" + "\n".join(broken)


def test_every_link_of_the_docs_lands() -> None:
    broken, count = [], 0
    for path in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        for number, line in enumerate(without_code_blocks(read(path)).split("\n"), 1):
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):  # https:, mailto:
                    continue
                count += 1
                file_part, _, anchor = target.partition("#")
                page = (path.parent / file_part).resolve() if file_part else path
                where = f"{path.relative_to(ROOT)}:{number}: {target}"
                if not page.is_relative_to(ROOT) or not page.exists():
                    broken.append(where + " (no such file in the repository)")
                elif anchor and page.suffix == ".md" and anchor not in anchors(page):
                    broken.append(where + " (no such heading)")
    assert count > 50
    assert not broken, "\n".join(broken)


def test_the_checks_catch_a_rotten_pointer(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## Fit\n\n### In-container limits (HAMi-core)\n\n## Fit\n", encoding="utf-8")
    assert names_heading(page, "Fit")
    assert names_heading(page, "In-container limits")
    assert not names_heading(page, "Fi")
    assert not names_heading(page, "Title page")
    assert anchors(page) == {"title", "fit", "in-container-limits-hami-core", "fit-1"}
    assert POINTER.search('see docs/protocol.md, "Requests", "Scoring")') is not None
    assert QUOTED.findall('"Requests", "Scoring"') == ["Requests", "Scoring"]
    assert slug("Device config (`devices.nvidia`, HAMi's `nvidia:` block)") == (
        "device-config-devicesnvidia-hamis-nvidia-block"
    )
