"""The node agent's rights (issue 11, finding 5: "the agent may patch every pod and node in the cluster").

RBAC cannot name "this node" for a DaemonSet, so the chart ships two ValidatingAdmissionPolicies for the
agent's service account (templates/node-agent/admission-policy.yaml). Here the RENDERED policies are
evaluated with a real CEL engine (PyPI ``common-expression-language``, through the embedded cluster's
policy step ``hami_testkit.admission_policy.review``) against AdmissionRequests as kube-apiserver builds
them: the agent's own writes pass, the same writes on another node's objects, any other field, taking
the node lock, creates, deletes, status writes and a token without a node are refused, and nobody else
is affected. Also: the chart hands the agent the scheduler name its Allocate checks.
"""

from __future__ import annotations

import copy
from typing import Any

import helm_python as helm
import pytest

from hami_testkit.admission_policy import Denial, review, service_account
from nodeagent.config import parse_agent_config

from .rendering import CHART, NAMESPACE, VALUE_SETS, argv, container, render

AGENT = service_account(NAMESPACE, "hami-node-agent")
SCHEDULER = service_account(NAMESPACE, "hami-scheduler")
NODE_NAME = "authentication.kubernetes.io/node-name"
LOCK = "hami.io/mutex.lock"
REGISTER = "hami.io/node-nvidia-register"

NODE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {
        "name": "n1",
        "labels": {"gpu": "on", "kubernetes.io/hostname": "n1"},
        "annotations": {REGISTER: "[]", LOCK: "2026-03-01T12:00:00Z,team,train"},
    },
    "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
}
POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "train",
        "namespace": "team",
        "labels": {"app": "train", "hami.io/vgpu-node": "n1"},
        "annotations": {
            "hami.io/vgpu-node": "n1",
            "hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,3000,30:;",
            "hami.io/vgpu-devices-to-allocate": "GPU-a,NVIDIA,3000,30:;",
            "hami.io/bind-phase": "allocating",
        },
    },
    "spec": {
        "schedulerName": "hami-scheduler",
        "nodeName": "n1",
        "containers": [{"name": "c", "image": "x"}],
    },
}


def policies(values: dict[str, Any] | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rendered = render(values)
    return rendered.of_kind("ValidatingAdmissionPolicy"), rendered.of_kind("ValidatingAdmissionPolicyBinding")


def changed(
    obj: dict[str, Any], *, annotations: dict[str, str | None] | None = None, **fields: Any
) -> dict[str, Any]:
    """A copy of ``obj`` with annotations set (None removes) and top-level metadata/spec fields replaced."""
    result = copy.deepcopy(obj)
    target = result["metadata"].setdefault("annotations", {})
    for key, value in (annotations or {}).items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = value
    for path, value in fields.items():
        section, _, key = path.partition("__")
        result[section][key] = value
    return result


def request(
    new: dict[str, Any] | None,
    old: dict[str, Any] | None,
    *,
    user: str = AGENT,
    node: str | None = "n1",
    operation: str = "UPDATE",
    subresource: str = "",
) -> dict[str, Any]:
    """An AdmissionRequest as kube-apiserver hands it to a policy (a patch arrives as an UPDATE)."""
    obj = new or old
    assert obj is not None
    extra = {NODE_NAME: [node]} if node is not None else {}
    return {
        "uid": "u1",
        "kind": {"group": "", "version": "v1", "kind": obj["kind"]},
        "resource": {"group": "", "version": "v1", "resource": obj["kind"].lower() + "s"},
        "subResource": subresource,
        "name": obj["metadata"]["name"],
        "namespace": obj["metadata"].get("namespace", ""),
        "operation": operation,
        "userInfo": {"username": user, "groups": ["system:serviceaccounts"], "extra": extra},
        "object": new,
        "oldObject": old,
        "dryRun": False,
    }


def verdict(admission: dict[str, Any]) -> Denial | None:
    return review(*policies(), admission)


def refused(admission: dict[str, Any]) -> str:
    denial = verdict(admission)
    assert denial is not None, "allowed"
    assert denial.code == 403 and denial.policy.startswith("hami-node-agent-"), denial
    prefix = f"ValidatingAdmissionPolicy '{denial.policy}' with binding '{denial.binding}' denied request: "
    assert denial.message.startswith(prefix), denial.message
    return denial.message.removeprefix(prefix)


# ------------------------------------------------------------------------------- what the agent does
@pytest.mark.parametrize(
    ("new", "old"),
    [
        (changed(NODE, annotations={REGISTER: '[{"id": "GPU-a"}]'}), NODE),  # registration
        (changed(NODE, annotations={"hami.io/node-nvidia-score": "{}"}), NODE),  # pair scores
        (changed(NODE, annotations={"hami.io/node-enforcement": "GPU-a:none"}), NODE),  # enforcement
        (changed(NODE, annotations={LOCK: None}), NODE),  # lock release
        (
            changed(
                POD, annotations={"hami.io/vgpu-devices-to-allocate": ";", "hami.io/bind-phase": "success"}
            ),
            POD,
        ),
        (changed(POD, annotations={"hami.io/bind-phase": "failed"}), POD),
        (changed(POD, annotations={"hami.io/vgpu-mig-allocations": "[]"}), POD),
    ],
    ids=["register", "scores", "enforcement", "unlock", "served", "failed", "mig"],
)
def test_the_agents_own_writes_on_its_node_pass(new: dict[str, Any], old: dict[str, Any]) -> None:
    assert verdict(request(new, old)) is None


def test_other_users_are_not_affected() -> None:
    taken = changed(NODE, annotations={LOCK: "2026-03-01T12:05:00Z,team,other"})
    assert verdict(request(taken, NODE, user=SCHEDULER, node=None)) is None  # the scheduler takes locks
    assert verdict(request(changed(NODE, metadata__labels={}), NODE, user="alice", node=None)) is None


# ------------------------------------------------------------------------------- what it may not do
def test_another_nodes_objects_are_refused() -> None:
    elsewhere = changed(NODE, metadata__name="n2")
    message = refused(request(changed(elsewhere, annotations={REGISTER: "[]x"}), elsewhere))
    assert message == "the node agent of node n1 may not change node n2"
    pod = changed(POD, spec__nodeName="n2")
    message = refused(request(changed(pod, annotations={"hami.io/bind-phase": "success"}), pod))
    assert message == "the node agent of node n1 may not change pod team/train on node n2"
    pending = copy.deepcopy(POD)
    del pending["spec"]["nodeName"]
    message = refused(request(changed(pending, annotations={"hami.io/bind-phase": "failed"}), pending))
    assert message.endswith("pod team/train, which is bound to no node")


def test_a_token_without_a_node_is_refused() -> None:
    message = refused(request(changed(NODE, annotations={LOCK: None}), NODE, node=None))
    assert "names no node" in message and "1.30" in message and "ServiceAccountTokenPodNodeInfo" in message


@pytest.mark.parametrize(
    ("new", "old", "message"),
    [
        (
            changed(NODE, annotations={LOCK: "2026-03-01T12:05:00Z,team,mine"}),
            changed(NODE, annotations={LOCK: None}),
            "the node agent may release the node lock (hami.io/mutex.lock), never take or change it",
        ),
        (
            changed(NODE, annotations={LOCK: "2026-03-01T12:05:00Z,team,mine"}),
            NODE,
            "the node agent may release the node lock (hami.io/mutex.lock), never take or change it",
        ),
        (
            changed(NODE, annotations={"hami.io/device-cordon": "GPU-a"}),
            NODE,
            "the node agent may change only the annotations hami.io/node-nvidia-register, "
            "hami.io/node-nvidia-score, hami.io/node-enforcement, hami.io/mutex.lock of a node, not "
            "hami.io/device-cordon",
        ),
        (
            changed(NODE, metadata__labels={"node-role.kubernetes.io/control-plane": ""}),
            NODE,
            "the node agent may not change a node's labels or spec",
        ),
        (changed(NODE, spec__taints=[]), NODE, "the node agent may not change a node's labels or spec"),
        (
            changed(POD, annotations={"hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,1,1:;"}),
            POD,
            "the node agent may change only the annotations hami.io/vgpu-devices-to-allocate, "
            "hami.io/vgpu-mig-allocations, hami.io/bind-phase of a pod, not hami.io/vgpu-devices-allocated",
        ),
        (
            changed(POD, annotations={"hami.io/vgpu-node": None}),
            POD,
            "the node agent may change only the annotations hami.io/vgpu-devices-to-allocate, "
            "hami.io/vgpu-mig-allocations, hami.io/bind-phase of a pod, not hami.io/vgpu-node",
        ),
        (
            changed(POD, metadata__labels={"app": "frontend"}),  # would join another Service
            POD,
            "the node agent may not change a pod's labels or spec",
        ),
        (
            changed(POD, annotations={"hami.io/bind-phase": "allocating"}, spec__schedulerName="x"),
            POD,
            "the node agent may not change a pod's labels or spec",
        ),
        (
            changed(
                changed(POD, annotations={"hami.io/bind-phase": "failed"}),
                annotations={"hami.io/bind-phase": "allocating"},
            ),
            changed(POD, annotations={"hami.io/bind-phase": "failed"}),
            "the node agent sets hami.io/bind-phase only to success or failed",
        ),
    ],
    ids=[
        "take-lock",
        "change-lock",
        "cordon",
        "label-node",
        "taints",
        "allocated",
        "vgpu-node",
        "label-pod",
        "spec",
        "phase",
    ],
)
def test_anything_else_on_its_own_node_is_refused(
    new: dict[str, Any], old: dict[str, Any], message: str
) -> None:
    assert refused(request(new, old)) == message


@pytest.mark.parametrize(
    ("obj", "operation", "subresource", "message"),
    [
        (POD, "CREATE", "", "the node agent only updates pods; it may not CREATE"),
        (POD, "DELETE", "", "the node agent only updates pods; it may not DELETE"),
        (NODE, "DELETE", "", "the node agent only updates nodes; it may not DELETE"),
        (NODE, "UPDATE", "status", "the node agent only updates nodes; it may not write status"),
        (POD, "UPDATE", "status", "the node agent only updates pods; it may not write status"),
    ],
)
def test_creates_deletes_and_status_writes_are_refused(
    obj: dict[str, Any], operation: str, subresource: str, message: str
) -> None:
    new = None if operation == "DELETE" else obj
    old = None if operation == "CREATE" else obj
    assert refused(request(new, old, operation=operation, subresource=subresource)) == message


# ------------------------------------------------------------------------------- chart wiring
def test_the_policies_name_the_agents_own_service_account() -> None:
    rendered = render(VALUE_SETS["everything-on"])  # fullnameOverride "gpu"
    conditions = {
        p["metadata"]["name"]: p["spec"].get("matchConditions")
        for p in rendered.of_kind("ValidatingAdmissionPolicy")
    }
    expected = [
        {
            "name": "node-agent",
            "expression": "request.userInfo.username == 'system:serviceaccount:hami-system:gpu-node-agent'",
        }
    ]
    assert conditions["gpu-node-agent-nodes"] == expected and conditions["gpu-node-agent-pods"] == expected
    bound = {b["spec"]["policyName"] for b in rendered.of_kind("ValidatingAdmissionPolicyBinding")}
    assert {"gpu-node-agent-nodes", "gpu-node-agent-pods"} <= bound


def test_the_policies_can_be_turned_off_and_go_with_the_agent() -> None:
    for values in ({"nodeAgent": {"admissionPolicy": {"enabled": False}}}, {"nodeAgent": {"enabled": False}}):
        names = {p["metadata"]["name"] for p in render(values).of_kind("ValidatingAdmissionPolicy")}
        assert not any(name.startswith("hami-node-agent") for name in names), values


@pytest.mark.parametrize(
    ("kube_version", "enabled", "refused_here"),
    [("v1.29.9", True, True), ("v1.30.0", True, False), ("v1.29.9", False, False)],
)
def test_older_clusters_are_told_to_upgrade_or_opt_out(
    capfd: pytest.CaptureFixture[str], kube_version: str, enabled: bool, refused_here: bool
) -> None:
    """Helm's lint mode logs a template's ``fail`` instead of raising; the log is the evidence here."""
    values = {
        "nodeAgent": {"admissionPolicy": {"enabled": enabled}},
        "webhook": {"annotationPolicy": {"enabled": False}},
    }
    helm.lint(str(CHART), values, namespace=NAMESPACE, kube_version=kube_version)
    logged = capfd.readouterr()
    assert ("nodeAgent.admissionPolicy needs Kubernetes >= 1.30" in logged.out + logged.err) is refused_here


@pytest.mark.parametrize("value_set", ["defaults", "custom-scheduler-name"])
def test_the_agent_checks_pods_against_the_charts_scheduler_name(value_set: str) -> None:
    values = VALUE_SETS[value_set]
    ours = container(render(values).component("DaemonSet", "node-agent"), "node-agent")
    config = parse_agent_config(argv(ours)[1:], {"NODE_NAME": "n1"})
    assert config.scheduler_name == values.get("schedulerName", "hami-scheduler")
