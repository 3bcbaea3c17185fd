"""``hami doctor`` against a cluster (kmock as the API server): a healthy installation reports only OK
lines and exits 0; each kind of problem is reported with its message and makes the exit code 1."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import kmock
import pytest

from hami import cli
from hami.annotations import (
    NODE_ENFORCEMENT,
    NODE_HANDSHAKE,
    NODE_LOCK,
    NODE_REGISTER,
    POD_DEVICES_ALLOCATED,
    POD_VGPU_NODE,
    AnnotationError,
    Enforcement,
    decode_node_lock,
    decode_pod_devices,
    encode_node_enforcement,
    read_node,
)
from hami.commands.doctor import doctor
from hami.doctor.findings import DoctorSettings
from hami.kube.client import load_api_client
from tests.builders import (
    NOW,
    create,
    create_hostile_nodes,
    device,
    handshake,
    lock,
    make_node,
    make_pod,
    placed,
    webhook_config,
)


async def seed(
    apiserver: kmock.KubernetesEmulator,
    *,
    configs: list[dict[str, Any]] = (),  # type: ignore[assignment]
    nodes: list[dict[str, Any]] = (),  # type: ignore[assignment]
    pods: list[dict[str, Any]] = (),  # type: ignore[assignment]
) -> None:
    await create(apiserver, *configs, *nodes, *pods)


async def run_doctor(kubeconfig: Path) -> tuple[int, list[str]]:
    out = io.StringIO()
    api = load_api_client(str(kubeconfig))
    try:
        code = await doctor(api, DoctorSettings(), out=out, now=NOW)
    finally:
        api.close()
    return code, out.getvalue().splitlines()


def enforced(*uuids: str) -> dict[str, str]:
    """The agent's report that HAMi-core holds each of these cards."""
    return {NODE_ENFORCEMENT: encode_node_enforcement(dict.fromkeys(uuids, Enforcement.HAMI_CORE))}


def healthy_gpu_node() -> dict[str, Any]:
    return make_node(
        "gpu-a",
        device("GPU-a0"),
        device("GPU-a1"),
        labels={"gpu": "on"},
        # held by default/holder for 10 s: an allocation in progress
        annotations={NODE_LOCK: lock(10), **enforced("GPU-a0", "GPU-a1")},
    )


async def test_healthy_cluster_is_all_ok(apiserver: kmock.KubernetesEmulator, kubeconfig: Path) -> None:
    await seed(
        apiserver,
        configs=[webhook_config()],
        nodes=[healthy_gpu_node(), make_node("cpu", cards=0)],
        pods=[
            make_pod("holder", annotations=placed("gpu-a", "GPU-a0", 4000, 30)),
            make_pod("web", gpus=0, scheduler="default-scheduler"),  # not a GPU pod: not our business
        ],
    )
    code, lines = await run_doctor(kubeconfig)
    assert lines == [
        "OK    webhook  mutatingwebhookconfiguration hami-webhook webhook vgpu.hami.io: routes pods to "
        "service kube-system/hami-webhook/webhook, failurePolicy Fail",
        "OK    node     node gpu-a: 2 cards registered, all healthy",
        "OK    lock     cluster: no node lock is unreadable, expired or dangling (1 held)",
        "OK    pod      cluster: 1 GPU pod, none stuck allocating, failed, unrouted or unreadable",
        "OK    usage    cluster: no card is granted beyond its memory, cores or slots (2 cards)",
        "0 FAIL, 0 WARN, 5 OK",
    ]
    assert code == 0


async def test_every_problem_is_reported(apiserver: kmock.KubernetesEmulator, kubeconfig: Path) -> None:
    bad_register = "not json"
    bad_lock = "yesterday,default"
    bad_devices = "GPU-a0,NVIDIA;"
    await seed(
        apiserver,
        configs=[webhook_config(ca_bundle="", failure_policy="Ignore")],
        nodes=[
            make_node("gpu-a", device("GPU-a0"), device("GPU-a1"), annotations=enforced("GPU-a0", "GPU-a1")),
            make_node("broken", register=bad_register, cards=0, annotations=enforced()),
            make_node(
                "sick",
                device("GPU-s0"),
                device("GPU-s1", health=False),
                annotations={NODE_ENFORCEMENT: "GPU-s0:hami-core,GPU-s1:none"},
            ),
            make_node("agentless", labels={"gpu": "on"}, cards=0),
            make_node("stale", device("GPU-t0"), allocatable=0, annotations={NODE_HANDSHAKE: handshake(95)}),
            make_node("lock-bad", annotations={NODE_LOCK: bad_lock}, cards=0),
            make_node("lock-old", annotations={NODE_LOCK: lock(400)}, cards=0),
            make_node("lock-gone", annotations={NODE_LOCK: lock(10, "default", "ghost")}, cards=0),
        ],
        pods=[
            make_pod("holder", annotations=placed("gpu-a", "GPU-a0", 1000, 10)),
            make_pod(
                "stuck", annotations=placed("gpu-a", "GPU-a0", 1000, 10, phase="allocating", bound_ago=600)
            ),
            make_pod(
                "failed", annotations=placed("gpu-a", "GPU-a0", 1000, 10, phase="failed"), phase="Pending"
            ),
            make_pod("unrouted", gpus=2, memory=None, cores=None, scheduler=None),
            make_pod("garbled", annotations={POD_VGPU_NODE: "gpu-a", POD_DEVICES_ALLOCATED: bad_devices}),
            # two pods of 6000 MiB and 60% each on one 10000 MiB card
            make_pod("over-1", annotations=placed("gpu-a", "GPU-a1", 6000, 60)),
            make_pod("over-2", annotations=placed("gpu-a", "GPU-a1", 6000, 60)),
        ],
    )
    register_error = str(_error(lambda: read_node("broken", {NODE_REGISTER: bad_register})))
    lock_error = str(_error(lambda: decode_node_lock(bad_lock)))
    devices_error = str(_error(lambda: decode_pod_devices(bad_devices)))
    code, lines = await run_doctor(kubeconfig)
    text = "\n".join(lines)
    expected = [
        # webhook: no CA bundle, failure policy Ignore
        "FAIL  webhook  mutatingwebhookconfiguration hami-webhook webhook vgpu.hami.io: caBundle is empty: "
        "the API server cannot verify service kube-system/hami-webhook/webhook",
        "WARN  webhook  mutatingwebhookconfiguration hami-webhook webhook vgpu.hami.io: failurePolicy "
        "Ignore: while the webhook is unreachable GPU pods are admitted unchanged and never reach "
        "hami-scheduler",
        # nodes
        "FAIL  node     node broken: registration unreadable, the scheduler excludes the node: "
        + register_error,
        "FAIL  node     node agentless: labelled gpu=on but has no hami.io/node-nvidia-register: the node "
        "agent is not running there or cannot write the Node",
        "WARN  node     node sick: 1 of 2 cards unhealthy: GPU-s1",
        f"FAIL  node     node stale: handshake {handshake(95)!r} unanswered for 95 s and nvidia.com/gpu "
        "allocatable is 0: the scheduler excludes the node",
        # enforcement: a card at none, and a node whose agent does not report it
        "WARN  enforce  node sick: slices are not enforced inside containers on 1 of 2 cards (no HAMi-core "
        "at <hookPath>/vgpu: GPU-s1)",
        "WARN  enforce  node stale: slices are not enforced inside containers as far as anyone can tell: no "
        "hami.io/node-enforcement (a node agent older than it, or HAMi's)",
        # locks
        f"FAIL  lock     node lock-bad: unreadable node lock, every bind on the node fails: {lock_error} -> "
        "kubectl annotate node lock-bad hami.io/mutex.lock-",
        "WARN  lock     node lock-gone: held by default/ghost, which no longer exists (dangling): the next "
        "bind takes it over",
        "WARN  lock     node lock-old: held by default/holder for 400 s, longer than the 300 s lock timeout: "
        "the next bind on the node takes it over",
        # pods
        "WARN  pod      pod default/failed: bind-phase failed on gpu-a",
        f"FAIL  pod      pod default/garbled: {devices_error}: the scheduler does not count this pod's cards",
        "FAIL  pod      pod default/stuck: bind-phase allocating for 600 s on gpu-a, longer than the 300 s "
        "lock timeout: the node agent never finished the hand-off",
        "FAIL  pod      pod default/unrouted: asks for nvidia.com/gpu but its schedulerName is "
        "'default-scheduler', not 'hami-scheduler': the webhook did not route it",
        # usage: GPU-a1 holds 2 x (6000 MiB, 60%, 1 slot)
        "FAIL  usage    node gpu-a card GPU-a1: granted beyond the card: memory 12000/10000 MiB, "
        "cores 120/100% (pods default/over-1, default/over-2)",
    ]
    for message in expected:
        assert message in text, f"missing: {message}\n--- got:\n{text}"
    # the healthy parts still say OK; GPU-a0 (holder + stuck = 2000 MiB) is not over
    assert "OK    node     node gpu-a: 2 cards registered, all healthy" in lines
    assert "card GPU-a0" not in text
    assert "OK    node     node stale: 1 card registered, all healthy" in lines
    assert len(lines) == len(expected) + 3  # the two OK lines above and the summary
    assert lines[-1] == "9 FAIL, 7 WARN, 2 OK"
    assert code == 1


def _error(call: Any) -> AnnotationError:
    with pytest.raises(AnnotationError) as caught:
        call()
    return caught.value


async def test_missing_webhook_and_gpu_nodes(apiserver: kmock.KubernetesEmulator, kubeconfig: Path) -> None:
    other = webhook_config(
        "istio", webhook_name="sidecar.istio.io", client_config={"url": "https://x/inject"}
    )
    await seed(apiserver, configs=[other], nodes=[make_node("cpu", cards=0)])
    code, lines = await run_doctor(kubeconfig)
    assert lines[0] == (
        "FAIL  webhook  cluster: no MutatingWebhookConfiguration has a webhook with path /webhook or a name "
        "containing 'hami': GPU pods are not routed to hami-scheduler -> install the webhook "
        "(helm upgrade --install hami charts/hami)"
    )
    assert lines[1].startswith(
        "WARN  node     cluster: no node is labelled gpu=on or carries hami.io/node-nvidia-register"
    )
    assert code == 1


async def test_cli_exit_codes(
    apiserver: kmock.KubernetesEmulator, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await seed(apiserver, configs=[webhook_config()], nodes=[healthy_gpu_node()])
    # the console script runs its own event loop: keep it off the loop serving the apiserver
    code = await asyncio.to_thread(cli.main, ["doctor", "--kubeconfig", str(kubeconfig)])
    assert code == 0, capsys.readouterr().out
    assert "OK    node     node gpu-a: 2 cards registered, all healthy" in capsys.readouterr().out
    await create(apiserver, make_node("agentless", labels={"gpu": "on"}, cards=0))
    code = await asyncio.to_thread(cli.main, ["doctor", "--kubeconfig", str(kubeconfig)])
    assert code == 1
    assert "FAIL  node     node agentless" in capsys.readouterr().out
    missing = tmp_path / "nowhere"
    code = await asyncio.to_thread(cli.main, ["doctor", "--kubeconfig", str(missing)])
    assert code == 2
    assert f"hami doctor: Config: kubeconfig file not found: '{missing}'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        cli.main(["doctor", "--lock-timeout", "soon"])
    assert exited.value.code == 2
    assert "--lock-timeout: must be a number of seconds, got 'soon'" in capsys.readouterr().err


async def test_objects_of_hostile_shapes_read_as_absent(
    apiserver: kmock.KubernetesEmulator, kubeconfig: Path
) -> None:
    """A Node or Pod whose labels, status, containers or schedulerName are not of their JSON type (a test
    server stores anything) is read as lacking them: the report goes on, nothing raises."""
    odd_node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "odd", "labels": ["gpu=on"]}}
    gpu = {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    odd_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "odd", "namespace": "default", "labels": "x", "annotations": ["a"]},
        "spec": {"schedulerName": 3, "containers": ["c", {"name": "d", "resources": "many"}, gpu]},
        "status": "Running",
    }
    gpu_node = make_node("gpu-a", device("GPU-a0"), labels={"gpu": "on"}, annotations=enforced("GPU-a0"))
    await seed(apiserver, configs=[webhook_config()], nodes=[gpu_node, odd_node], pods=[odd_pod])
    code, lines = await run_doctor(kubeconfig)
    assert lines[1:] == [
        "OK    node     node gpu-a: 1 card registered, all healthy",
        "OK    lock     cluster: no node lock is unreadable, expired or dangling (0 held)",
        # schedulerName 3 reads as absent: the API server's default
        "FAIL  pod      pod default/odd: asks for nvidia.com/gpu but its schedulerName is "
        "'default-scheduler', not 'hami-scheduler': the webhook did not route it -> check the webhook "
        "findings and the namespace's hami.io/webhook label, then recreate the pod",
        "OK    usage    cluster: no card is granted beyond its memory, cores or slots (1 card)",
        "1 FAIL, 0 WARN, 4 OK",
    ]
    assert code == 1


async def test_nodes_of_hostile_shapes_are_reported_and_the_rest_checked(
    apiserver: kmock.KubernetesEmulator, kubeconfig: Path
) -> None:
    """Nodes whose registration is not a string, whose annotations or allocatable are not objects, or
    whose metadata is not an object are each a FAIL (the scheduler excludes them); the healthy node and
    its pod are checked as usual (before: the snapshot raised on them and the doctor crashed)."""
    await seed(
        apiserver,
        configs=[webhook_config()],
        nodes=[healthy_gpu_node()],
        pods=[make_pod("holder", annotations=placed("gpu-a", "GPU-a0", 4000, 30))],
    )
    await create_hostile_nodes(apiserver)
    code, lines = await run_doctor(kubeconfig)
    action = "no API server stores such a Node: check what wrote it, and fix or recreate it"
    assert lines[1:] == [
        "FAIL  node     node (no name): malformed Node, the scheduler excludes it: metadata is not an object "
        f"-> {action}",
        "OK    node     node gpu-a: 2 cards registered, all healthy",
        "FAIL  node     node int-register: malformed Node, the scheduler excludes it: annotation "
        f"{NODE_REGISTER} is not a string -> {action}",
        "FAIL  node     node list-annotations: malformed Node, the scheduler excludes it: "
        f"metadata.annotations is not an object -> {action}",
        "FAIL  node     node string-allocatable: malformed Node, the scheduler excludes it: "
        f"status.allocatable is not an object -> {action}",
        "OK    lock     cluster: no node lock is unreadable, expired or dangling (1 held)",
        "OK    pod      cluster: 1 GPU pod, none stuck allocating, failed, unrouted or unreadable",
        "OK    usage    cluster: no card is granted beyond its memory, cores or slots (2 cards)",
        "4 FAIL, 0 WARN, 5 OK",
    ]
    assert code == 1
