"""The rule behind ``hami doctor``'s enforcement lines: one WARN per GPU node (a node carrying
``hami.io/node-nvidia-register``) whose cards are not held to their slices inside containers.

A node warns when its ``hami.io/node-enforcement`` lists a card at ``none``, when the annotation is
missing (an agent older than the annotation, or HAMi's, which does not write it) or when it cannot be
read (the codec's error quoted). A node whose cards are all enforced gives no line. Annotation values
are read with the codec only.

Pure: no I/O, no clock, no logging; must not import the Kubernetes client or ``hami.kube``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hami.annotations import (
    NODE_ENFORCEMENT,
    NODE_REGISTER,
    AnnotationError,
    Enforcement,
    decode_node_enforcement,
    node_shape_problem,
    pod_annotations,
)
from hami.doctor.findings import Finding, Severity, finding, name_of, plural

#: Where the install guide says how to check that HAMi-core is in place.
VERIFY = "see docs/install.md#verify"
NOT_ENFORCED = "slices are not enforced inside containers"


def check_enforcement(nodes: Iterable[Mapping[str, Any]]) -> list[Finding]:
    """One WARN per registered node without enforcement (missing, unreadable or ``none`` cards)."""
    found: list[Finding] = []
    for node in sorted(nodes, key=name_of):
        if node_shape_problem(node) is not None:
            continue  # reported as a malformed Node by the node check
        annotations = pod_annotations(node)
        if NODE_REGISTER not in annotations:
            continue
        name = name_of(node)
        subject = f"node {name}"
        text = annotations.get(NODE_ENFORCEMENT)
        if text is None:
            message = (
                f"{NOT_ENFORCED} as far as anyone can tell: no {NODE_ENFORCEMENT} (a node agent older "
                "than it, or HAMi's)"
            )
            action = f"run this project's node agent on {name}; {VERIFY}"
            found.append(finding(Severity.WARN, "enforce", subject, message, action))
            continue
        try:
            cards = decode_node_enforcement(text)
        except AnnotationError as exc:
            message = f"{NOT_ENFORCED} as far as anyone can tell: {exc}"
            action = f"check hami-node-agent's log on {name}; it rewrites the annotation every 30 s"
            found.append(finding(Severity.WARN, "enforce", subject, message, action))
            continue
        bare = [uuid for uuid, kind in cards.items() if kind is Enforcement.NONE]
        if not bare:
            continue
        which = "" if len(bare) == len(cards) else f" on {len(bare)} of {plural(len(cards), 'card')}"
        message = f"{NOT_ENFORCED}{which} (no HAMi-core at <hookPath>/vgpu: {', '.join(bare)})"
        action = f"install libvgpu.so in <hookPath>/vgpu and start the agent with --hook-path; {VERIFY}"
        found.append(finding(Severity.WARN, "enforce", subject, message, action))
    return found
