"""The invariant checker is not vacuous: each rule flags the state it exists for, and a consistent
cluster passes. Objects are built with the project's codec, as the scheduler and agent write them."""

from __future__ import annotations

import datetime
from typing import Any

from hami.annotations import (
    NODE_LOCK,
    NODE_REGISTER,
    BindPhase,
    NodeLockValue,
    allocation_annotations,
    bind_annotations,
    encode_node_devices,
    encode_node_lock,
    encode_pod_devices,
)
from hami.annotations.keys import POD_DEVICES_TO_ALLOCATE
from hami.core.model import Device, Grant

from .checker import Served, View, bound_usage, card_usage, check, dead_holder

NOW = datetime.datetime(2026, 5, 1, 10, 0, tzinfo=datetime.UTC)
TIMEOUT = datetime.timedelta(minutes=5)


def node(name: str = "n1", *, lock: str | None = None) -> dict[str, Any]:
    cards = [
        Device(uuid=f"GPU-{name}-{i}", index=i, count=2, memory_mib=8000, cores=100, type="T4", health=True)
        for i in range(2)
    ]
    annotations = {NODE_REGISTER: encode_node_devices(cards)}
    if lock is not None:
        annotations[NODE_LOCK] = lock
    return {"metadata": {"name": name, "annotations": annotations}}


def g(uuid: str, memory: int, cores: int = 0) -> Grant:
    return Grant(uuid=uuid, memory_mib=memory, cores=cores)


def pod(
    name: str,
    *grants: Grant,
    node_name: str | None = "n1",
    vgpu_node: str = "n1",
    phase: str = "Pending",
    bind_phase: BindPhase = BindPhase.ALLOCATING,
    served: bool = False,
) -> dict[str, Any]:
    devices = ((*grants,),)
    annotations = allocation_annotations(node=vgpu_node, devices=devices, now=NOW)
    annotations.update(bind_annotations(bind_phase, now=NOW))
    if served:
        annotations[POD_DEVICES_TO_ALLOCATE] = encode_pod_devices(((),))
    spec: dict[str, Any] = {"containers": [{"name": "main"}]}
    if node_name:
        spec["nodeName"] = node_name
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "annotations": annotations},
        "spec": spec,
        "status": {"phase": phase},
    }


def view(nodes: list[dict[str, Any]], pods: list[dict[str, Any]], **kw: Any) -> View:
    return View(nodes=nodes, pods=pods, lock_timeout=TIMEOUT, **{"now": NOW, **kw})


def rule(name: str, problems: list[str]) -> list[str]:
    return [p for p in problems if p.startswith(f"[{name}]")]


def lock(name: str, at: datetime.datetime = NOW) -> str:
    return encode_node_lock(NodeLockValue(time=at, namespace="default", name=name))


def test_a_consistent_cluster_has_no_violation() -> None:
    pods = [
        pod("a", g("GPU-n1-0", 5000, 50)),
        pod("b", g("GPU-n1-0", 3000, 50)),
        pod("c", g("GPU-n1-1", 8000)),
    ]
    assert check(view([node()], pods)) == []


def test_memory_cores_slots_and_exclusivity_over_a_card_are_each_flagged() -> None:
    memory = check(view([node()], [pod("a", g("GPU-n1-0", 5000)), pod("b", g("GPU-n1-0", 3001))]))
    where = "node n1 card GPU-n1-0 (default/a, default/b)"
    assert memory == [
        f"[bound] {where}: memory 8001 > 8000 MiB",
        f"[counted] {where}: memory 8001 > 8000 MiB",
    ]
    cores = check(view([node()], [pod("a", g("GPU-n1-0", 1, 60)), pod("b", g("GPU-n1-0", 1, 41))]))
    assert rule("bound", cores) == [f"[bound] {where}: cores 101 > 100"]
    slots = check(view([node()], [pod(x, g("GPU-n1-1", 1)) for x in "abc"]))
    assert rule("bound", slots) == [
        "[bound] node n1 card GPU-n1-1 (default/a, default/b, default/c): slots 3 > 2"
    ]
    shared = check(view([node()], [pod("a", g("GPU-n1-0", 1, 100)), pod("b", g("GPU-n1-0", 1, 0))]))
    assert rule("bound", shared) == [f"[bound] {where}: a pod holding all cores shares the card"]


def test_only_pods_that_will_run_on_the_node_count_as_bound() -> None:
    others = [
        pod("done", g("GPU-n1-0", 8000), phase="Succeeded"),
        pod("refused", g("GPU-n1-0", 8000), bind_phase=BindPhase.FAILED),
        pod("unbound", g("GPU-n1-0", 8000), node_name=None),
        pod("elsewhere", g("GPU-n2-0", 8000), node_name="n2", vgpu_node="n2"),
    ]
    problems = check(view([node(), node("n2")], [pod("a", g("GPU-n1-0", 8000)), *others]))
    assert rule("bound", problems) == []
    assert problems == [  # the scheduler's rule still counts the unbound allocation (a bind in flight)
        "[counted] node n1 card GPU-n1-0 (default/a, default/unbound): memory 16000 > 8000 MiB"
    ]


def test_a_bound_pod_holding_another_nodes_card_is_flagged() -> None:
    stale = pod("a", g("GPU-n2-0", 1000), node_name="n1", vgpu_node="n2")
    assert check(view([node(), node("n2")], [stale])) == [
        "[bound] node n1: default/a hold card GPU-n2-0, not a card of n1"
    ]


def test_allocate_serving_a_pod_another_pods_grant_is_flagged() -> None:
    pods = [pod("a", g("GPU-n1-0", 3000, 30)), pod("b", g("GPU-n1-1", 2000, 10))]
    own = Served(
        namespace="default",
        name="a",
        uid="uid-a",
        node="n1",
        index=0,
        init=False,
        grants=(g("GPU-n1-0", 3000, 30),),
    )
    assert check(view([node()], pods, served=(own,))) == []
    wrong = Served(
        namespace="default",
        name="a",
        uid="uid-a",
        node="n1",
        index=0,
        init=False,
        grants=(g("GPU-n1-1", 2000, 10),),
    )
    assert check(view([node()], pods, served=(wrong,))) == [
        "[served-match] pod default/a container #0 was served [('GPU-n1-1', 2000, 10)] but its "
        "vgpu-devices-allocated holds [('GPU-n1-0', 3000, 30)]"
    ]


def test_what_allocate_handed_out_is_summed_per_card() -> None:
    pods = [pod("a", g("GPU-n1-0", 5000)), pod("b", g("GPU-n1-0", 5000), bind_phase=BindPhase.FAILED)]
    served = tuple(
        Served(
            namespace="default",
            name=n,
            uid=f"uid-{n}",
            node="n1",
            index=0,
            init=False,
            grants=(g("GPU-n1-0", 5000),),
        )
        for n in "ab"
    )
    problems = check(view([node()], pods, served=served))
    assert "[served] node n1 card GPU-n1-0 (default/a, default/b): memory 10000 > 8000 MiB" in problems


def test_a_lock_kept_after_the_last_container_was_served_is_flagged() -> None:
    served = pod("a", g("GPU-n1-0", 1000), bind_phase=BindPhase.SUCCESS, served=True)
    assert check(view([node(lock=lock("a"))], [served])) == [
        f"[lock] node n1: lock {lock('a')!r} outlived its holder: default/a has every container served"
    ]
    expired = lock("a", NOW - TIMEOUT - datetime.timedelta(seconds=1))
    assert check(view([node(lock=expired)], [served])) == []
    assert check(view([node(lock="not a lock")], []))[0].startswith("[lock] node n1: unreadable lock")


def test_dead_holder_names_every_way_a_holder_can_never_be_allocated() -> None:
    def reason(holder: dict[str, Any] | None, **kw: Any) -> str | None:
        return dead_holder(
            view([node(lock=lock("a"))], [holder] if holder else [], **kw), node(lock=lock("a"))
        )

    waiting = pod("a", g("GPU-n1-0", 1000))
    assert reason(waiting) is None
    assert reason(None) == "default/a is gone"
    assert reason(pod("a", g("GPU-n1-0", 1), phase="Failed")) == "default/a is Failed"
    assert reason(pod("a", g("GPU-n2-0", 1), node_name="n2", vgpu_node="n2")) == "default/a is bound to n2"
    failed = pod("a", g("GPU-n1-0", 1), node_name=None, bind_phase=BindPhase.FAILED)
    assert (
        reason(failed)
        == "default/a has bind-phase=failed, no bind in flight, and failed after it took the lock"
    )
    failed["metadata"]["annotations"].update(
        bind_annotations(BindPhase.FAILED, now=NOW - datetime.timedelta(seconds=1))
    )
    assert reason(failed) is None  # failed before the lock was taken: a new attempt may own it
    later = NOW + datetime.timedelta(seconds=31)
    assert reason(failed, now=later) == (
        "default/a has bind-phase=failed, no bind in flight and a lock older than the bind timeout"
    )
    assert reason(failed, now=later, busy=frozenset({("default", "a")})) is None  # its bind still runs
    done = pod("a", g("GPU-n1-0", 1), bind_phase=BindPhase.SUCCESS, served=True)
    assert reason(done) == "default/a has every container served"


def test_init_containers_count_once_and_not_after_they_finished() -> None:
    p = pod("a", g("GPU-n1-0", 6000, 10))
    p["spec"]["initContainers"] = [{"name": "init"}]
    init = Grant(uuid="GPU-n1-0", memory_mib=7000, cores=20)
    p["metadata"]["annotations"].update(
        allocation_annotations(node="n1", devices=((init,), (g("GPU-n1-0", 6000, 10),)), now=NOW)
    )
    holders, _ = bound_usage([p], "n1")
    use = card_usage(holders.items(), {})["GPU-n1-0"]
    assert (use.memory, use.cores, use.slots) == (7000, 20, 1)
    p["status"]["initContainerStatuses"] = [{"name": "init", "state": {"terminated": {"exitCode": 0}}}]
    holders, _ = bound_usage([p], "n1")
    use = card_usage(holders.items(), {})["GPU-n1-0"]
    assert (use.memory, use.cores, use.slots) == (6000, 10, 1)


def test_the_scheduler_rule_counts_binds_in_flight_until_the_horizon() -> None:
    bound = pod("a", g("GPU-n1-0", 5000))
    in_flight = pod("b", g("GPU-n1-0", 5000), node_name=None)  # bind-time NOW: a bind in flight
    assert check(view([node()], [bound, in_flight])) == [
        "[counted] node n1 card GPU-n1-0 (default/a, default/b): memory 10000 > 8000 MiB"
    ]
    later = View(
        nodes=[node()],
        pods=[bound, in_flight],
        now=NOW + datetime.timedelta(seconds=61),
        lock_timeout=TIMEOUT,
    )
    assert check(later) == []  # past the horizon an unbound allocation no longer counts
    undone = pod("b", g("GPU-n1-0", 5000), node_name=None, bind_phase=BindPhase.FAILED)
    assert check(view([node()], [bound, undone])) == []
