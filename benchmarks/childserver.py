"""The embedded API server in a child process, for the benchmarks that must not share its CPU.

Owns :func:`apiserver_process`: runs ``code`` (a Python program that starts the test kit's API server,
prints its URL on one line and serves until its stdin closes) with this interpreter, yields the URL and
stops the child on exit.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def apiserver_process(code: str) -> Iterator[str]:
    """The API server ``code`` starts, in a child process; yields its URL, stops it on exit."""
    process = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        if not url.startswith("http"):
            raise RuntimeError("the embedded API server did not start")
        yield url
    finally:
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
