"""The one error every decoder raises: :class:`AnnotationError`, naming the key and the offending text.

Pure: stdlib only.
"""

from __future__ import annotations

#: Longest excerpt of the offending text quoted in a message (registration JSON can be kilobytes);
#: the full text stays available as ``.text``.
QUOTE_LIMIT = 200


def quote(text: str) -> str:
    """``text`` in double quotes, shortened in the middle when it is long; a character that is not
    printable (a newline, an escape sequence, a bidirectional control) is written as its escape, so an
    annotation's text cannot start a line of its own or steer a terminal where the message is shown."""
    if len(text) > QUOTE_LIMIT:
        half = QUOTE_LIMIT // 2
        text = f"{text[:half]}...{text[-half:]}"
    text = text.replace("\\", "\\\\").replace('"', '\\"')
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return '"' + text + '"'


class AnnotationError(ValueError):
    """An annotation value that cannot be read.

    ``key`` is the annotation key, ``text`` the value as found (``None`` when the annotation is missing)
    and ``reason`` the bare explanation (HAMi's own wording where HAMi has one). ``str(error)`` reads
    ``<key> "<text>": <reason>``.
    """

    def __init__(self, key: str, text: str | None, reason: str) -> None:
        where = f"{key} (missing)" if text is None else f"{key} {quote(text)}"
        super().__init__(f"{where}: {reason}")
        self.key = key
        self.text = text
        self.reason = reason

    def __reduce__(self) -> tuple[type[AnnotationError], tuple[str, str | None, str]]:
        return (type(self), (self.key, self.text, self.reason))
