"""End to end: with the chart's annotation policy in force, HAMi's own writes go through and a pod owner's
do not (issue 11, finding 2).

The whole system runs as ``hami demo`` runs it, each component with its own credentials. A shared-GPU
pod is scheduled, bound and allocated (the scheduler's bind and the agent's hand-over both write
``hami.io/`` annotations), then its owner tries the edits that were reproduced against the running
components: every one is refused with the policy's message and changes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hami.annotations import POD_BIND_PHASE, POD_DEVICES_ALLOCATED, POD_DEVICES_TO_ALLOCATE, POD_VGPU_NODE
from hami_testkit.admission_standin import Admitted
from hami_testkit.cluster import parse_cluster
from hami_testkit.demo_session import final_state, submit_all, wait_decided
from hami_testkit.kubeapi import ApiError, SimApi, pods_path
from hami_testkit.system import ACCOUNTS, SCHEDULER, USER, EmbeddedSystem

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

CLUSTER = (
    "nodes:\n  - {name: n1, cards: [{uuid: GPU-00000001-0000-4000-8000-000000000001, memory_mib: 16384}]}\n"
)


def _pod(name: str, limits: dict[str, str] | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": "x"}
    if limits:
        container["resources"] = {"limits": limits}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [container]},
    }


def _refusal(key: str, *, label: bool = False) -> str:
    what = (
        f"label {key} is written by HAMi only (its scheduler)"
        if label
        else f"annotation {key} is written by HAMi only (its scheduler and node agent)"
    )
    return (
        "ValidatingAdmissionPolicy 'hami-annotations' with binding 'hami-annotations' denied request: "
        f"{what}; {ACCOUNTS[USER]} may not set, change or remove it"
    )


async def test_owners_cannot_edit_what_the_scheduler_and_agent_wrote(workdir: Path) -> None:
    shared = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"}
    async with EmbeddedSystem(parse_cluster(CLUSTER, source="policy"), workdir) as system:
        names, refused = await submit_all(system, [_pod("train", shared)])
        assert refused == {}
        assert await wait_decided(system, names, refused, limit=120) == []
        assert isinstance(await system.admission.submit(_pod("busybox")), Admitted)  # default-scheduler's
        names.append("default/busybox")
        before = await final_state(system, names, refused)
        train, busybox = pods_path("default", "train"), pods_path("default", "busybox")
        attempts: list[tuple[str, Any, str]] = [
            (
                train,
                {"metadata": {"annotations": {POD_DEVICES_ALLOCATED: "GPU-x,NVIDIA,1,1:;"}}},
                POD_DEVICES_ALLOCATED,
            ),
            (train, {"metadata": {"annotations": {POD_VGPU_NODE: None}}}, POD_VGPU_NODE),
            (
                train,
                {"metadata": {"annotations": {POD_DEVICES_TO_ALLOCATE: "GPU-x,NVIDIA,3000,30:;"}}},
                POD_DEVICES_TO_ALLOCATE,
            ),
            (busybox, {"metadata": {"annotations": {POD_VGPU_NODE: "n1"}}}, POD_VGPU_NODE),
        ]
        answers = []
        for path, body, _ in attempts:
            try:
                await system.api.merge_patch(path, body)
                answers.append((200, ""))
            except ApiError as exc:
                answers.append((exc.status, exc.message))
        try:
            await system.api.merge_patch(busybox, {"metadata": {"labels": {POD_VGPU_NODE: "n1"}}})
            label_answer = (200, "")
        except ApiError as exc:
            label_answer = (exc.status, exc.message)
        # ordinary metadata stays the owner's; the scheduler's own account still may write
        await system.api.merge_patch(
            train, {"metadata": {"annotations": {"team": "a"}, "labels": {"app": "x"}}}
        )
        scheduler = SimApi(system.session, system.url, token=system.tokens[SCHEDULER])
        await scheduler.merge_patch(busybox, {"metadata": {"annotations": {"hami.io/vgpu-time": "1"}}})
        after = await final_state(system, names, refused)
    assert answers == [(403, _refusal(key)) for _, _, key in attempts]
    assert label_answer == (403, _refusal(POD_VGPU_NODE, label=True))
    trained, was = after["default/train"], before["default/train"]
    assert trained is not None and was is not None
    assert trained["status"]["phase"] == "Running"
    assert was["metadata"]["annotations"][POD_BIND_PHASE] == "success"  # bind and Allocate went through
    hami_keys = {k: v for k, v in trained["metadata"]["annotations"].items() if k.startswith("hami.io/")}
    assert hami_keys == {k: v for k, v in was["metadata"]["annotations"].items() if k.startswith("hami.io/")}
    assert trained["metadata"]["annotations"]["team"] == "a" and trained["metadata"]["labels"]["app"] == "x"
    quiet = after["default/busybox"]
    assert quiet is not None
    assert quiet["metadata"]["annotations"] == {"hami.io/vgpu-time": "1"}
    assert POD_VGPU_NODE not in (quiet["metadata"].get("labels") or {})
