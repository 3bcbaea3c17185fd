"""``hami doctor``'s enforcement rule: one WARN per GPU node whose cards are not held to their slices
(a card at ``none``, the annotation missing or unreadable); enforced and CPU nodes give no line."""

from __future__ import annotations

from typing import Any

import pytest

from hami.annotations import NODE_ENFORCEMENT, AnnotationError, decode_node_enforcement
from hami.doctor.enforcement import check_enforcement
from hami.doctor.findings import Severity, exit_code
from tests.builders import device, make_node

WARN = Severity.WARN
ACTION = (
    "install libvgpu.so in <hookPath>/vgpu and start the agent with --hook-path; see docs/install.md#verify"
)


def gpu_node(enforcement: str | None) -> dict[str, Any]:
    annotations = {} if enforcement is None else {NODE_ENFORCEMENT: enforcement}
    return make_node("gpu-1", device("GPU-0"), device("GPU-1"), annotations=annotations)


def codec_error(text: str) -> str:
    with pytest.raises(AnnotationError) as caught:
        decode_node_enforcement(text)
    return str(caught.value)


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        (gpu_node("GPU-0:hami-core,GPU-1:hami-core"), []),
        (gpu_node("GPU-0:mig,GPU-1:mps-namespaced"), []),
        (make_node("cpu", cards=0), []),  # not a GPU node: nothing to enforce
        (make_node("cpu", cards=0, annotations={NODE_ENFORCEMENT: "junk"}), []),
        (
            gpu_node("GPU-0:none,GPU-1:none"),
            [
                (
                    WARN,
                    "node gpu-1",
                    "slices are not enforced inside containers (no HAMi-core at <hookPath>/vgpu: "
                    "GPU-0, GPU-1)",
                    ACTION,
                )
            ],
        ),
        (
            gpu_node("GPU-0:hami-core,GPU-1:none"),
            [
                (
                    WARN,
                    "node gpu-1",
                    "slices are not enforced inside containers on 1 of 2 cards (no HAMi-core at "
                    "<hookPath>/vgpu: GPU-1)",
                    ACTION,
                )
            ],
        ),
        (
            gpu_node(None),
            [
                (
                    WARN,
                    "node gpu-1",
                    "slices are not enforced inside containers as far as anyone can tell: no "
                    "hami.io/node-enforcement (a node agent older than it, or HAMi's)",
                    "run this project's node agent on gpu-1; see docs/install.md#verify",
                )
            ],
        ),
        (
            gpu_node("GPU-0:HAMI-CORE"),
            [
                (
                    WARN,
                    "node gpu-1",
                    "slices are not enforced inside containers as far as anyone can tell: "
                    + codec_error("GPU-0:HAMI-CORE"),
                    "check hami-node-agent's log on gpu-1; it rewrites the annotation every 30 s",
                )
            ],
        ),
    ],
)
def test_enforcement(node: dict[str, Any], expected: list[tuple[Severity, str, str, str]]) -> None:
    found = check_enforcement([node])
    assert [(f.severity, f.subject, f.message, f.action) for f in found] == expected
    assert all(f.check == "enforce" for f in found)
    assert exit_code(found) == 0  # a WARN never fails the run


def test_one_line_per_node_in_name_order_and_a_malformed_node_is_left_to_the_node_check() -> None:
    malformed: dict[str, Any] = {"metadata": {"name": "odd", "annotations": []}}
    nodes = [gpu_node(None), make_node("gpu-0", device("GPU-9")), malformed]
    assert [f.subject for f in check_enforcement(nodes)] == ["node gpu-0", "node gpu-1"]
