"""Namespace GPU quotas (docs/protocol.md, "Quotas"): ResourceQuotas watched from the embedded API server,
used amounts from the tracked pods, enforced by /filter and /bind over HTTP; and the quota book alone."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from hami.annotations import POD_DEVICES_ALLOCATED, POD_VGPU_NODE, decode_pod_devices
from hami.core.model import NamespaceQuota
from hami.core.usage import pod_usage
from hami.scheduler.quotas import QuotaBook
from hami.settings import DeviceConfig
from tests.builders import make_node, make_pod
from tests.eventually import eventually

from .kit import Extender, StartExtender

MEM = "limits.nvidia.com/gpumem"
CORES = "limits.nvidia.com/gpucores"


def make_quota(name: str, hard: dict[str, Any], namespace: str = "team") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"hard": hard},
    }


def running_pod(name: str, node: str, devices: str, namespace: str = "team") -> dict[str, Any]:
    """A pod already placed by the scheduler (counts against its cards and its namespace)."""
    pod = make_pod(name, namespace=namespace)
    pod["metadata"]["annotations"] = {POD_VGPU_NODE: node, POD_DEVICES_ALLOCATED: devices}
    pod["spec"]["nodeName"] = node
    pod["status"]["phase"] = "Running"
    return pod


async def _filter(ext: Extender, pod: dict[str, Any]) -> Any:
    return await ext.filter(pod, ["n1"])


# ----------------------------------------------------------------------------------- over HTTP


async def test_a_pod_under_quota_fits_and_binds(start_extender: StartExtender) -> None:
    ext = await start_extender(
        nodes=[make_node("n1")],
        pods=[make_pod("p", memory=3000, cores=30, namespace="team")],
        quotas=[make_quota("gpu", {MEM: "4000", CORES: "50"})],
    )
    result = await _filter(ext, make_pod("p", memory=3000, cores=30, namespace="team"))
    assert result["NodeNames"] == ["n1"] and result["FailedNodes"] == {}
    assert await ext.bind("p", "n1", namespace="team") == {"Error": ""}
    assert ext.ctx.snapshot.quotas.used("team") == (3000, 30)  # the booking counts at once
    # the bound pod asked again (kube-scheduler retries): its own usage is not counted twice
    again = await _filter(ext, make_pod("p", memory=3000, cores=30, namespace="team"))
    assert again["NodeNames"] == ["n1"]


async def test_existing_usage_counts_and_deleting_the_pod_frees_the_quota(
    start_extender: StartExtender,
) -> None:
    ext = await start_extender(
        nodes=[make_node("n1")],
        pods=[
            running_pod("busy", "n1", "GPU-n1-0,NVIDIA,2000,20:;"),
            make_pod("p", memory=3000, cores=30, namespace="team"),
        ],
        quotas=[make_quota("gpu", {MEM: "4000"})],
    )
    pod = make_pod("p", memory=3000, cores=30, namespace="team")
    # 2000 used + 3000 asked > 4000 on every card; resolvable: it fits once "busy" is gone
    result = await _filter(ext, pod)
    assert result["NodeNames"] == []
    assert result["FailedNodes"] == {"n1": "2/2 ResourceQuotaNotFit"}
    assert "FailedAndUnresolvableNodes" not in result  # omitted when empty
    # another namespace has no quota: the same request fits
    assert (await _filter(ext, make_pod("p", memory=3000, namespace="default")))["NodeNames"] == ["n1"]
    # bind decides again and refuses the same way, without taking the lock
    bound = await ext.bind("p", "n1", namespace="team")
    assert bound["Error"] == "pod team/p does not fit node n1: 2/2 ResourceQuotaNotFit"
    assert "hami.io/mutex.lock" not in ((await ext.node("n1"))["metadata"].get("annotations") or {})

    response = await ext.apiserver.delete("/api/v1/namespaces/team/pods/busy")
    assert response.status == 200
    await eventually(lambda: ext.ctx.snapshot.quotas.used("team") == (0, 0), "the deletion to free the quota")
    assert (await _filter(ext, pod))["NodeNames"] == ["n1"]
    assert await ext.bind("p", "n1", namespace="team") == {"Error": ""}


async def test_the_filtering_failed_event_names_the_quota(start_extender: StartExtender) -> None:
    pod = make_pod("p", cores=10, namespace="team")  # stored: Events are only about pods that exist
    ext = await start_extender(nodes=[make_node("n1")], pods=[pod], quotas=[make_quota("gpu", {CORES: "0"})])
    result = await _filter(ext, pod)
    # a quota of 0 blocks everything, and no other pod leaving can change that: unresolvable
    assert result["FailedAndUnresolvableNodes"] == {"n1": "2/2 ResourceQuotaNotFit"}
    await ext.settle()
    events = [r.data for r in ext.apiserver["post"] if (r.data or {}).get("reason") == "FilteringFailed"]
    (event,) = events
    assert "1 nodes 2/2 ResourceQuotaNotFit(n1)" in event["message"]
    assert "the namespace's GPU ResourceQuota is used up" in event["message"]


async def test_memory_factor_multiplies_the_memory_limit(start_extender: StartExtender) -> None:
    # memoryFactor 10: a pod asking 300 asks 3000 MiB, and a quota of 400 allows 4000 MiB
    ext = await start_extender(
        nodes=[make_node("n1")],
        pods=[make_pod("small", memory=300, namespace="team")],
        quotas=[make_quota("gpu", {MEM: "400"})],
        device_config=DeviceConfig(memory_factor=10),
    )
    assert ext.ctx.snapshot.quotas.quota("team") == NamespaceQuota(memory_limit=4000)
    assert (await _filter(ext, make_pod("small", memory=300, namespace="team")))["NodeNames"] == ["n1"]
    big = await _filter(ext, make_pod("big", memory=500, namespace="team"))  # 5000 > 4000
    assert big["FailedAndUnresolvableNodes"] == {"n1": "2/2 ResourceQuotaNotFit"}
    assert await ext.bind("small", "n1", namespace="team") == {"Error": ""}
    (grants,) = decode_pod_devices(
        (await ext.pod("small", "team"))["metadata"]["annotations"][POD_DEVICES_ALLOCATED]
    )
    assert [g.memory_mib for g in grants] == [3000]
    assert ext.ctx.snapshot.quotas.used("team") == (3000, 30)


async def test_a_malformed_quota_value_is_logged_and_ignored(
    start_extender: StartExtender, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="hami.scheduler.quotas")
    ext = await start_extender(
        nodes=[make_node("n1")],
        quotas=[
            make_quota("bad-memory", {MEM: "lots", CORES: "20"}),
            make_quota("only-bad", {MEM: "-5"}, namespace="other"),
        ],
    )
    # the readable half of the quota still counts; the unreadable half is as if absent
    assert ext.ctx.snapshot.quotas.quota("team") == NamespaceQuota(cores_limit=20)
    assert ext.ctx.snapshot.quotas.quota("other") is None
    assert (await _filter(ext, make_pod("p", memory=9000, cores=20, namespace="team")))["NodeNames"] == ["n1"]
    over = await _filter(ext, make_pod("p", memory=1000, cores=30, namespace="team"))
    assert over["FailedAndUnresolvableNodes"] == {"n1": "2/2 ResourceQuotaNotFit"}
    assert (await _filter(ext, make_pod("p", memory=9000, namespace="other")))["NodeNames"] == ["n1"]
    messages = [r.getMessage() for r in caplog.records]
    assert any(
        "resourcequota team/bad-memory: spec.hard[limits.nvidia.com/gpumem]" in m and "'lots'" in m
        for m in messages
    ), messages
    assert any("resourcequota other/only-bad" in m and "negative" in m for m in messages), messages


async def test_quota_changes_are_watched(start_extender: StartExtender) -> None:
    ext = await start_extender(nodes=[make_node("n1")])
    pod = make_pod("p", memory=3000, namespace="team")
    assert (await _filter(ext, pod))["NodeNames"] == ["n1"]
    await ext.apiserver.post("/api/v1/namespaces/team/resourcequotas", json=make_quota("gpu", {MEM: "8000"}))
    await ext.apiserver.post(
        "/api/v1/namespaces/team/resourcequotas", json=make_quota("tighter", {MEM: "2000"})
    )
    await eventually(lambda: len(ext.ctx.snapshot.quotas) == 2, "both quotas to be seen")
    # several quotas in one namespace: the tightest limit applies
    assert (await _filter(ext, pod))["FailedAndUnresolvableNodes"] == {"n1": "2/2 ResourceQuotaNotFit"}
    await ext.apiserver.delete("/api/v1/namespaces/team/resourcequotas/tighter")
    await eventually(lambda: len(ext.ctx.snapshot.quotas) == 1, "the deletion to be seen")
    assert (await _filter(ext, pod))["NodeNames"] == ["n1"]


# -------------------------------------------------------------------------------- the book alone


def _book(factor: int = 1) -> QuotaBook:
    return QuotaBook(
        memory_resource="nvidia.com/gpumem", cores_resource="nvidia.com/gpucores", memory_factor=factor
    )


@pytest.mark.parametrize(
    ("text", "limit"),
    [("4000", 4000), ("4k", 4000), ("1.5k", 1500), ("1Ki", 1024), ("100m", 1), ("0", 0)],
    ids=["plain", "k", "fraction-k", "Ki", "milli-rounds-up", "zero"],
)
def test_limits_are_whole_numbers_rounded_up(text: str, limit: int) -> None:
    assert _book().limits_of(make_quota("q", {MEM: text})).memory == limit


def test_only_the_gpu_limits_are_read() -> None:
    book = _book(factor=3)
    quota = make_quota("q", {"limits.cpu": "4", "requests.nvidia.com/gpumem": "10", CORES: "50"})
    book.replace([quota])
    assert book.quota("team") == NamespaceQuota(cores_limit=50)
    book.replace([make_quota("q", {"pods": "10"})])
    assert book.quota("team") is None and len(book) == 0  # no GPU limit: not tracked at all
    book.event("ADDED", make_quota("q", {MEM: "1000"}))
    assert book.quota("team") == NamespaceQuota(memory_limit=3000)  # x memoryFactor
    book.event("DELETED", make_quota("q", {}))
    assert book.quota("team") is None


def test_usage_moves_with_the_pods_and_one_pod_can_be_left_out() -> None:
    book = _book()
    book.replace([make_quota("a", {MEM: "9000", CORES: "90"}), make_quota("b", {MEM: "5000"})])
    usage = pod_usage(decode_pod_devices("GPU-0,NVIDIA,1000,10:GPU-1,NVIDIA,1000,10:;"), 0, init_done=False)
    book.add_usage("team", usage)
    book.add_usage("team", usage)
    assert book.quota("team") == NamespaceQuota(
        memory_limit=5000, cores_limit=90, memory_used=4000, cores_used=40
    )
    assert book.quota("team", exclude=usage) == NamespaceQuota(
        memory_limit=5000, cores_limit=90, memory_used=2000, cores_used=20
    )
    book.add_usage("team", usage, -1)
    book.add_usage("team", usage, -1)
    assert book.used("team") == (0, 0)


def test_the_snapshot_counts_a_namespace_like_its_nodes() -> None:
    from hami.scheduler.snapshot import Snapshot

    snapshot = Snapshot(quotas=_book())
    snapshot.replace_nodes([make_node("n1")])
    snapshot.replace_quotas([make_quota("gpu", {MEM: "10000"})])
    snapshot.replace_pods([running_pod("a", "n1", "GPU-n1-0,NVIDIA,1000,10:;")])
    assert snapshot.ready
    moved = running_pod("a", "n1", "GPU-n1-1,NVIDIA,2500,10:;")
    snapshot.pod_event("MODIFIED", moved)
    snapshot.pod_event("MODIFIED", moved)  # idempotent, like a reconnecting watch
    assert snapshot.quotas.used("team") == (2500, 10)
    finished = running_pod("a", "n1", "GPU-n1-1,NVIDIA,2500,10:;")
    finished["status"]["phase"] = "Succeeded"
    snapshot.pod_event("MODIFIED", finished)
    assert snapshot.quotas.used("team") == (0, 0)
    assert snapshot.quotas_for("team") == {"team": NamespaceQuota(memory_limit=10000)}
