"""Which binds take the node lock and how long they wait for it (docs/protocol.md, "Node lock"): PodGroup
members wait up to --node-lock-retry-timeout, other pods follow --node-lock-wait; every pod with a GPU
request takes the lock, one whose only GPU request is in init containers too (HAMi skips it)."""

from __future__ import annotations

import asyncio
from typing import Any

import kmock
import pytest

from hami.annotations import NODE_LOCK, POD_BIND_PHASE, POD_GROUP_LABEL, decode_pod_devices
from hami.kube.nodelock import release_node_lock
from tests.builders import make_node, make_pod
from tests.eventually import eventually

from .kit import Extender, StartExtender

PODS = kmock.resource("v1/pods")
EVENTS = kmock.resource("v1/events")
NODES = kmock.resource("v1/nodes")
HELD = "2026-05-01T09:59:00Z,default,holder"  # a fresh lock of a live pod
BUSY = "node n1 has been locked within 5m0s by default/holder: node lock contention"


def group_pod(name: str, group: str = "training") -> dict[str, Any]:
    pod = make_pod(name)
    pod["metadata"]["labels"] = {POD_GROUP_LABEL: group}
    return pod


def init_only_pod(name: str) -> dict[str, Any]:
    """The GPU request sits in the init container; the app container asks for none."""
    pod = make_pod(name, gpus=0)
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2000", "nvidia.com/gpucores": "20"}
    pod["spec"]["initContainers"] = [{"name": "warmup", "image": "cuda", "resources": {"limits": limits}}]
    return pod


async def _lock(ext: Extender) -> str | None:
    value: str | None = ((await ext.node("n1"))["metadata"].get("annotations") or {}).get(NODE_LOCK)
    return value


def _holder_checks(ext: Extender) -> int:
    """How often a bind found the lock busy and asked whether its holder pod still exists."""
    return len([r for r in ext.apiserver["get", PODS] if r.name == "holder"])


async def _start(start_extender: StartExtender, *pods: dict[str, Any], **overrides: Any) -> Extender:
    return await start_extender(
        nodes=[make_node("n1", annotations={NODE_LOCK: HELD})],
        pods=[make_pod("holder"), *pods],
        **overrides,
    )


async def test_a_group_member_waits_for_the_lock_until_it_is_released(start_extender: StartExtender) -> None:
    ext = await _start(start_extender, group_pod("g"))  # defaults: node-lock-wait 0, retry 28 s
    assert ext.ctx.settings.node_lock_retry_timeout == 28.0
    binding = asyncio.create_task(ext.bind("g", "n1"))
    # the bind found the lock busy (it checked the holder) and is still waiting, not failed
    await eventually(lambda: _holder_checks(ext) >= 1, "the bind to meet the busy lock")
    assert not binding.done()
    assert await release_node_lock(ext.ctx.api, "n1", "default", "holder")  # the agent's release
    result = await eventually(lambda: binding.result() if binding.done() else None, "the bind's answer")
    assert result == {"Error": ""}
    assert await _lock(ext) == "2026-05-01T10:00:00Z,default,g"
    assert (await ext.pod("g"))["metadata"]["annotations"][POD_BIND_PHASE] == "allocating"


@pytest.mark.parametrize(
    ("pod", "overrides"),
    [
        (make_pod("g"), {}),  # not a group member: HAMi fails at once
        (group_pod("g", group=""), {}),  # an empty group label is no group
        (group_pod("g"), {"node_lock_retry_timeout": 0.0}),  # retry disabled
    ],
    ids=["plain-pod", "empty-group-label", "retry-disabled"],
)
async def test_other_binds_fail_at_once_on_a_busy_lock(
    start_extender: StartExtender, pod: dict[str, Any], overrides: dict[str, Any]
) -> None:
    ext = await _start(start_extender, pod, **overrides)
    result = await ext.bind("g", "n1")
    assert result["Error"] == BUSY
    assert _holder_checks(ext) == 1  # one attempt, no retry
    assert await _lock(ext) == HELD


async def test_a_group_member_gives_up_after_the_retry_timeout(start_extender: StartExtender) -> None:
    ext = await _start(start_extender, group_pod("g"), node_lock_retry_timeout=0.3)
    result = await ext.bind("g", "n1")
    assert result["Error"] == BUSY
    assert _holder_checks(ext) >= 1
    assert await _lock(ext) == HELD
    assert (await ext.pod("g"))["metadata"]["annotations"] == {
        POD_BIND_PHASE: "failed",
        "hami.io/bind-time": "1777629600",
    }


async def test_an_unreadable_lock_fails_a_group_member_at_once(start_extender: StartExtender) -> None:
    # not contention (HAMi retries only ErrNodeLockContention): a value nobody can read never changes
    # by itself, so waiting the 28 s retry timeout would only delay the same answer
    unreadable = "2026-05-01T09:59:00Z,default"
    ext = await start_extender(
        nodes=[make_node("n1", annotations={NODE_LOCK: unreadable})],
        pods=[group_pod("g")],
        node_lock_retry_timeout=5.0,  # a wait, if any, would end with the contention error instead
    )
    result = await ext.bind("g", "n1")
    assert result["Error"] == (
        f'node n1 has an unreadable lock: {NODE_LOCK} "{unreadable}": malformed lock: expected '
        "<time>,<namespace>,<pod>, got 2 parts"
    )
    # read once: that the node exists, which the lock decides on; never again (a wait re-reads every second)
    assert len([r for r in ext.apiserver["get", NODES] if r.name == "n1"]) == 1
    assert await _lock(ext) == unreadable  # not taken over: nobody can tell who holds it
    assert len(ext.apiserver["patch", NODES]) == 0
    assert (await ext.pod("g"))["metadata"]["annotations"][POD_BIND_PHASE] == "failed"
    await ext.settle()
    (event,) = [r.data for r in ext.apiserver["post", EVENTS] if r.data["reason"] == "BindingFailed"]
    assert event["type"] == "Warning"
    assert event["message"] == (
        f"{result['Error']}. It never expires: once no pod is being allocated on the node, remove it "
        f"(kubectl annotate node n1 {NODE_LOCK}-); kube-scheduler retries the pod"
    )


async def test_an_init_container_only_pod_takes_the_lock_too(start_extender: StartExtender) -> None:
    # HAMi lets it bind without the lock; then the node agent cannot tell its grant from the lock
    # owner's, and two scheduler replicas can both place such pods on the same room
    ext = await _start(start_extender, init_only_pod("warm"), make_pod("app"))
    assert (await ext.bind("app", "n1"))["Error"] == BUSY
    assert (await ext.bind("warm", "n1"))["Error"] == BUSY  # waits its turn like every GPU pod
    assert await _lock(ext) == HELD
    assert await release_node_lock(ext.ctx.api, "n1", "default", "holder")  # the agent's release
    assert await ext.bind("warm", "n1") == {"Error": ""}
    # one second after its first attempt's recorded failure (bind-time 10:00:00): a lock that is not
    # newer than its holder's failure may be taken over
    assert await _lock(ext) == "2026-05-01T10:00:01Z,default,warm"
    pod = await ext.pod("warm")
    annotations = pod["metadata"]["annotations"]
    assert annotations[POD_BIND_PHASE] == "allocating"
    init, app = decode_pod_devices(annotations["hami.io/vgpu-devices-to-allocate"])
    assert [(g.memory_mib, g.cores) for g in init] == [(2000, 20)] and app == ()
    assert pod["spec"]["nodeName"] == "n1"


async def test_an_init_only_bind_that_fails_releases_its_own_lock(start_extender: StartExtender) -> None:
    ext = await start_extender(nodes=[make_node("n1")], pods=[init_only_pod("warm")])
    (ext.apiserver**10)["post", PODS, kmock.subresource("binding")][:1] << 500
    result = await ext.bind("warm", "n1")
    assert result["Error"].startswith("500 "), result
    assert await _lock(ext) is None
    assert (await ext.pod("warm"))["metadata"]["annotations"][POD_BIND_PHASE] == "failed"
    await eventually(lambda: ext.ctx.snapshot.record(("default", "warm")) is None, "the booking to be undone")
