"""The one "does this pod still hold cards" rule (``hami.annotations.holding``), as tables: which pods hold
cards and where, for the scheduler and exporter (grant required) and for the MIG reclaim (any bound pod);
when init containers give their cards back; how long an unbound bind in flight counts."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from hami.annotations import (
    POD_BIND_PHASE,
    POD_BIND_TIME,
    POD_DEVICES_ALLOCATED,
    POD_VGPU_NODE,
    encode_unix_time,
)
from hami.annotations.holding import (
    ALLOCATING_HORIZON,
    Holding,
    Why,
    allocating_until,
    holding,
    init_containers_done,
)

NOW = datetime.datetime(2026, 3, 1, 12, 0, tzinfo=datetime.UTC)
GRANT = {POD_VGPU_NODE: "n1", POD_DEVICES_ALLOCATED: "GPU-a,NVIDIA,1000,10:;"}


def pod(
    *,
    annotations: dict[str, str] | None = None,
    node: str | None = None,
    phase: str | None = "Pending",
    labels: dict[str, str] | None = None,
    **status: Any,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "p", "namespace": "default"}
    if annotations is not None:
        metadata["annotations"] = annotations
    if labels is not None:
        metadata["labels"] = labels
    spec: dict[str, Any] = {"containers": [{"name": "c"}]}
    if node is not None:
        spec["nodeName"] = node
    body: dict[str, Any] = {"metadata": metadata, "spec": spec, "status": dict(status)}
    if phase is not None:
        body["status"]["phase"] = phase
    return body


def failed_bind(**more: str) -> dict[str, str]:
    return {**GRANT, POD_BIND_PHASE: "failed", **more}


# (case, pod, where it holds for the scheduler and exporter, where for the MIG reclaim)
CASES: list[tuple[str, dict[str, Any], Holding, Holding]] = [
    (
        "bound here, running",
        pod(annotations=GRANT, node="n1", phase="Running"),
        Holding(node="n1", why=Why.HOLDS),
        Holding(node="n1", why=Why.HOLDS),
    ),
    (
        "deleting pods hold until their containers stop",
        {**pod(annotations=GRANT, node="n1", phase="Running"), "deletionTimestamp": "2026-03-01T12:00:00Z"},
        Holding(node="n1", why=Why.HOLDS),
        Holding(node="n1", why=Why.HOLDS),
    ),
    (
        "phase Unknown holds",
        pod(annotations=GRANT, node="n1", phase="Unknown"),
        Holding(node="n1", why=Why.HOLDS),
        Holding(node="n1", why=Why.HOLDS),
    ),
    (
        "no phase yet holds",
        pod(annotations=GRANT, node="n1", phase=None),
        Holding(node="n1", why=Why.HOLDS),
        Holding(node="n1", why=Why.HOLDS),
    ),
    (
        "Succeeded holds nothing",
        pod(annotations=GRANT, node="n1", phase="Succeeded"),
        Holding(node=None, why=Why.FINISHED),
        Holding(node=None, why=Why.FINISHED),
    ),
    (
        "Failed holds nothing",
        pod(annotations=GRANT, node="n1", phase="Failed"),
        Holding(node=None, why=Why.FINISHED),
        Holding(node=None, why=Why.FINISHED),
    ),
    (
        "unbound with its bind in flight holds on the grant's node (the horizon is the caller's)",
        pod(annotations={**GRANT, POD_BIND_PHASE: "allocating"}),
        Holding(node="n1", why=Why.HOLDS),
        Holding(node=None, why=Why.NOT_BOUND),
    ),
    (
        "unbound after its bind failed holds nothing",
        pod(annotations=failed_bind()),
        Holding(node=None, why=Why.BIND_FAILED),
        Holding(node=None, why=Why.NOT_BOUND),
    ),
    (
        "bound although marked failed (a late Binding) still holds until kubelet rejects it",
        pod(annotations=failed_bind(), node="n1"),
        Holding(node="n1", why=Why.HOLDS),
        Holding(node="n1", why=Why.HOLDS),
    ),
    (
        "bound to another node than its grant names",
        pod(annotations=GRANT, node="n2", phase="Running"),
        Holding(node=None, why=Why.BOUND_ELSEWHERE),
        Holding(node="n2", why=Why.HOLDS),
    ),
    (
        "no vgpu-node annotation: another scheduler's pod",
        pod(annotations={POD_DEVICES_ALLOCATED: GRANT[POD_DEVICES_ALLOCATED]}, node="n1"),
        Holding(node=None, why=Why.NO_GRANT),
        Holding(node="n1", why=Why.HOLDS),
    ),
    (
        "an empty vgpu-node is none",
        pod(annotations={**GRANT, POD_VGPU_NODE: ""}, node="n1"),
        Holding(node=None, why=Why.NO_GRANT),
        Holding(node="n1", why=Why.HOLDS),
    ),
    (
        "vgpu-node without the allocation",
        pod(annotations={POD_VGPU_NODE: "n1"}, node="n1"),
        Holding(node=None, why=Why.NO_GRANT),
        Holding(node="n1", why=Why.HOLDS),
    ),
    (
        "the label alone is no grant",
        pod(
            annotations={POD_DEVICES_ALLOCATED: GRANT[POD_DEVICES_ALLOCATED]},
            labels={POD_VGPU_NODE: "n1"},
            node="n1",
        ),
        Holding(node=None, why=Why.NO_GRANT),
        Holding(node="n1", why=Why.HOLDS),
    ),
    (
        "hostile shapes read as absent, never raise",
        {"metadata": ["x"], "spec": "n1", "status": 7},
        Holding(node=None, why=Why.NO_GRANT),
        Holding(node=None, why=Why.NOT_BOUND),
    ),
    (
        "a non-text phase is no phase; a non-text node name is unbound",
        {"metadata": {"annotations": GRANT}, "spec": {"nodeName": 5}, "status": {"phase": ["Failed"]}},
        Holding(node="n1", why=Why.HOLDS),
        Holding(node=None, why=Why.NOT_BOUND),
    ),
]


@pytest.mark.parametrize(("case", "obj", "granted", "recorded"), CASES, ids=[c[0] for c in CASES])
def test_where_a_pod_holds_cards(case: str, obj: dict[str, Any], granted: Holding, recorded: Holding) -> None:
    assert holding(obj) == granted
    assert holding(obj, grant_required=True) == granted
    assert holding(obj, grant_required=False) == recorded
    assert holding(obj).holds is (granted.node is not None)


def _terminated(code: Any) -> dict[str, Any]:
    return {"name": "i", "state": {"terminated": {"exitCode": code}}}


@pytest.mark.parametrize(
    ("statuses", "done"),
    [
        (None, False),
        ([], False),
        ([_terminated(0)], True),
        ([_terminated(0), _terminated(0)], True),
        ([_terminated(0), _terminated(1)], False),
        ([_terminated(0), {"name": "j", "state": {"running": {}}}], False),
        ([{"name": "i", "state": {"terminated": {}}}], False),  # no exit code is not success
        ([_terminated("0")], False),  # exit codes are integers
        ([_terminated(False)], False),  # False == 0 in Python; not an exit code
        ([_terminated(0.0)], False),
        ("all done", False),
        ([7], False),
    ],
)
def test_init_containers_done(statuses: Any, done: bool) -> None:
    obj = pod(annotations=GRANT, node="n1")
    if statuses is not None:
        obj["status"]["initContainerStatuses"] = statuses
    assert init_containers_done(obj) is done


@pytest.mark.parametrize(
    ("annotations", "node", "until"),
    [
        (
            {POD_BIND_PHASE: "allocating", POD_BIND_TIME: encode_unix_time(NOW)},
            None,
            NOW + ALLOCATING_HORIZON,
        ),
        ({POD_BIND_PHASE: "allocating", POD_BIND_TIME: encode_unix_time(NOW)}, "n1", None),  # bound
        ({POD_BIND_PHASE: "success", POD_BIND_TIME: encode_unix_time(NOW)}, None, None),
        ({}, None, None),
        ({POD_BIND_PHASE: "allocating"}, None, datetime.datetime.min.replace(tzinfo=datetime.UTC)),
        (
            {POD_BIND_PHASE: "allocating", POD_BIND_TIME: "soon"},
            None,
            datetime.datetime.min.replace(tzinfo=datetime.UTC),
        ),
        (
            {POD_BIND_PHASE: "allocating", POD_BIND_TIME: "9" * 18},
            None,
            datetime.datetime.min.replace(tzinfo=datetime.UTC),
        ),
    ],
)
def test_allocating_until(
    annotations: dict[str, str], node: str | None, until: datetime.datetime | None
) -> None:
    assert allocating_until(pod(annotations={**GRANT, **annotations}, node=node)) == until


def test_allocating_until_takes_the_callers_horizon() -> None:
    obj = pod(annotations={**GRANT, POD_BIND_PHASE: "allocating", POD_BIND_TIME: encode_unix_time(NOW)})
    assert allocating_until(obj, datetime.timedelta(seconds=5)) == NOW + datetime.timedelta(seconds=5)
