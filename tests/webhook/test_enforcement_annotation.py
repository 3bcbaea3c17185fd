"""The webhook and ``hami.io/require-enforcement``: a readable level is admitted, an unreadable one is
refused at admission (422, ``bad_annotation``) naming the annotation and the accepted words; a new pod
may not carry the scheduler's ``hami.io/vgpu-enforcement``."""

from __future__ import annotations

import pytest

from hami.annotations import POD_REQUIRE_ENFORCEMENT, POD_VGPU_ENFORCEMENT
from webhook.mutation import Admit, Refuse, plan

from .webhook_cases import DEFAULT, GPU, ctr, make_pod


@pytest.mark.parametrize("value", ["none", "cooperative", "isolated", " isolated ", ""])
def test_a_readable_level_is_admitted(value: str) -> None:
    pod = make_pod(ctr(limits={GPU: "1"}), annotations={POD_REQUIRE_ENFORCEMENT: value})
    assert isinstance(plan(pod, DEFAULT), Admit)


@pytest.mark.parametrize("value", ["Isolated", "strict", "hami-core", "2", "cooperative,isolated"])
def test_an_unreadable_level_is_refused_naming_the_annotation(value: str) -> None:
    decision = plan(make_pod(ctr(limits={GPU: "1"}), annotations={POD_REQUIRE_ENFORCEMENT: value}), DEFAULT)
    assert isinstance(decision, Refuse)
    assert decision.code == 422 and decision.reason == "bad_annotation"
    assert decision.message == (
        f'annotation {POD_REQUIRE_ENFORCEMENT} "{value}": unknown enforcement level; '
        "expected none, cooperative, isolated"
    )


def test_a_new_pod_may_not_carry_the_granted_enforcement() -> None:
    pod = make_pod(ctr(limits={GPU: "1"}), annotations={POD_VGPU_ENFORCEMENT: "GPU-a:hami-core"})
    decision = plan(pod, DEFAULT)
    assert isinstance(decision, Refuse)
    assert f"annotation {POD_VGPU_ENFORCEMENT} is written by HAMi only" in decision.message
