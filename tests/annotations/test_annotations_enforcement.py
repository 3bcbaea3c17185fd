"""``hami.io/node-enforcement``: round trip and the strict decoder's errors (key and text named)."""

from __future__ import annotations

import pytest

from hami.annotations import (
    NODE_ENFORCEMENT,
    AnnotationError,
    Enforcement,
    decode_node_enforcement,
    encode_node_enforcement,
)


def test_round_trip_keeps_order_and_every_kind() -> None:
    cards = {f"GPU-{kind.value}": kind for kind in reversed(Enforcement)}
    text = encode_node_enforcement(cards)
    assert (
        text
        == "GPU-none:none,GPU-mig:mig,GPU-mps-namespaced:mps-namespaced,GPU-mps:mps,GPU-hami-core:hami-core"
    )
    decoded = decode_node_enforcement(text)
    assert decoded == cards and list(decoded) == list(cards)


def test_no_card_is_the_empty_text() -> None:
    assert encode_node_enforcement({}) == ""
    assert decode_node_enforcement("") == {}


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("GPU-a", "entry 'GPU-a' is not <uuid>:<kind>"),
        ("GPU-a:hami-core,", "entry '' is not <uuid>:<kind>"),
        (":none", "entry ':none' has no valid card UUID"),
        ("GPU a:none", "entry 'GPU a:none' has no valid card UUID"),
        ("GPU-a:none,GPU-a:mig", "card GPU-a is listed twice"),
        ("GPU-a:HAMI-CORE", "card GPU-a: unknown enforcement 'HAMI-CORE'"),
        ("GPU-a:mig:x", "card GPU-a: unknown enforcement 'mig:x'"),
        ("GPU-a: none", "card GPU-a: unknown enforcement ' none'"),
        ("GPU-\x1b]0;x\x07:none", "entry 'GPU-\\x1b]0;x\\x07:none' has no valid card UUID"),  # a terminal's
        ("GPU-\u202ea:none", "entry 'GPU-\\u202ea:none' has no valid card UUID"),  # right-to-left override
    ],
)
def test_strict_decode_names_the_key_and_the_text(text: str, reason: str) -> None:
    with pytest.raises(AnnotationError) as caught:
        decode_node_enforcement(text)
    assert caught.value.key == NODE_ENFORCEMENT and caught.value.text == text
    assert caught.value.reason.startswith(reason)
    assert str(caught.value).startswith(f'{NODE_ENFORCEMENT} "')


def test_an_overlong_value_is_refused_before_splitting() -> None:
    text = ",".join(f"GPU-{i}:none" for i in range(100_000))
    with pytest.raises(AnnotationError, match="longer than"):
        decode_node_enforcement(text)


@pytest.mark.parametrize("uuid", ["", "GPU a", "GPU-a,GPU-b", "GPU:a"])
def test_encode_refuses_what_the_decoder_would(uuid: str) -> None:
    with pytest.raises(ValueError, match="cannot be written"):
        encode_node_enforcement({uuid: Enforcement.NONE})
