"""The test kit reaches kmock's internals only through ``hami_testkit.kmock_seam.internals``, and that
seam fails loudly, naming the installed kmock version, when kmock is not the pinned one or moved what
it reads (docs/testing.md, "kmock's internals")."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import kmock
import pytest

import hami_testkit
from hami_testkit import kmock_seam
from hami_testkit.kmock_seam import PINNED, KmockChanged, internals

TESTKIT = Path(hami_testkit.__file__).parent
#: kmock's private names the seam wraps; none may appear in the test kit outside it.
PRIVATE = re.compile(
    r"kmock\._internal|\._(payloads|requests|errors|lock|buses|source|disabled|serve_version|"
    r"get_resources)\b|[^s]\.Request\._parse|_parsing\b"
)


def test_the_installed_kmock_is_the_pinned_one_with_everything_the_seam_reads() -> None:
    assert kmock_seam.missing() == [], (
        f"kmock {kmock_seam.installed()} is installed; the seam was written for {PINNED}"
    )
    project = tomllib.loads((TESTKIT.parent / "pyproject.toml").read_text(encoding="utf-8"))
    assert f"kmock=={PINNED}" in project["project"]["dependencies"]


def test_no_module_of_the_test_kit_but_the_seam_touches_kmock_internals() -> None:
    offenders = [
        f"{path.name}:{number}: {line.strip()}"
        for path in sorted(TESTKIT.glob("*.py"))
        if path.name != "kmock_seam.py"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if PRIVATE.search(line) and not line.lstrip().startswith("#")
    ]
    assert offenders == []


def test_another_kmock_version_fails_loudly_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kmock_seam, "_checked", None)
    monkeypatch.setattr(kmock_seam, "installed", lambda: "0.9")
    with pytest.raises(KmockChanged, match=r"kmock 0\.9 is installed.*kmock is 0\.9, not 0\.8"):
        internals(object())


def test_a_moved_internal_fails_loudly_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kmock_seam, "_checked", None)
    monkeypatch.delattr(kmock.RawHandler, "_stream_error")
    with pytest.raises(KmockChanged, match=r"kmock 0\.8 is installed.*RawHandler\._stream_error"):
        internals(object())


def test_no_test_imports_kmock_internals() -> None:
    tests = Path(__file__).parents[1]
    offenders = [
        f"{path.relative_to(tests)}:{number}"
        for path in sorted(tests.rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.match(r"\s*(from|import)\s+kmock\._internal", line)
    ]
    assert offenders == []
