"""AnnotationError: names key and text, keeps the whole text, survives pickling; the package surface."""

from __future__ import annotations

import pickle

import hami.annotations as codec
from hami.annotations import NODE_REGISTER, POD_DEVICES_ALLOCATED, AnnotationError
from hami.annotations.errors import QUOTE_LIMIT


def test_message_names_key_and_quotes_text() -> None:
    error = AnnotationError(POD_DEVICES_ALLOCATED, 'a"b', "broken")
    assert str(error) == f'{POD_DEVICES_ALLOCATED} "a\\"b": broken'
    assert (error.key, error.text, error.reason) == (POD_DEVICES_ALLOCATED, 'a"b', "broken")
    assert isinstance(error, ValueError)


def test_unprintable_text_is_escaped_in_the_message() -> None:
    """A node's annotation cannot print a forged line of its own, or a terminal escape, where the
    message is shown (``hami doctor``)."""
    error = AnnotationError(NODE_REGISTER, "a\nFAIL  x\x1b]0;t\x07", "bad")
    assert str(error) == f'{NODE_REGISTER} "a\\nFAIL  x\\x1b]0;t\\x07": bad'
    assert str(error).isprintable()


def test_long_text_is_shortened_only_in_the_message() -> None:
    text = "x" * 1000 + "END"
    error = AnnotationError(NODE_REGISTER, text, "bad")
    assert error.text == text
    assert "..." in str(error) and str(error).endswith('END": bad')
    assert len(str(error)) < QUOTE_LIMIT + len(NODE_REGISTER) + 20


def test_pickles_with_its_fields() -> None:
    error = pickle.loads(pickle.dumps(AnnotationError(NODE_REGISTER, None, "annos not found")))
    assert (error.key, error.text, error.reason) == (NODE_REGISTER, None, "annos not found")


def test_every_exported_name_exists_and_old_key_constants_still_import() -> None:
    assert all(hasattr(codec, name) for name in codec.__all__)
    assert codec.NODE_REGISTER == "hami.io/node-nvidia-register"
    assert codec.POD_DEVICES_ALLOCATED == "hami.io/vgpu-devices-allocated"
    assert codec.NODE_LOCK in codec.INTERNAL_POD_ANNOTATIONS
