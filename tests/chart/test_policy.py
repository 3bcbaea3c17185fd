"""The chart's annotation policy (issue 11, finding 2): the RENDERED ValidatingAdmissionPolicy, evaluated
with a real CEL engine (PyPI ``common-expression-language``) against AdmissionRequests for every attack
that was reproduced -- and for the writes HAMi itself must keep making.

Evaluation goes through ``hami_testkit.admission_policy.review`` (the embedded cluster's policy step; its own
mechanics are pinned in tests/testkit/test_admission_standin.py) over the documents Helm's library rendered.
"""

from __future__ import annotations

import copy
from typing import Any

import cel
import helm_python as helm
import pytest

from hami.annotations import INTERNAL_POD_ANNOTATIONS, POD_VGPU_NODE, keys
from hami_testkit.admission_policy import Denial, annotation_policy, review, service_account

from .rendering import CHART, NAMESPACE, VALUE_SETS, labels, pod_spec, render

COMPONENT = "annotation-policy"
SCHEDULER = service_account(NAMESPACE, "hami-scheduler")
AGENT = service_account(NAMESPACE, "hami-node-agent")
OWNER = "alice"
ALLOCATED = "GPU-a,NVIDIA,3000,30:;"
#: A GPU pod as it stands after bind and Allocate.
RUNNING: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "train",
        "namespace": "team",
        "labels": {"app": "train", POD_VGPU_NODE: "n1"},
        "annotations": {
            "hami.io/vgpu-node": "n1",
            "hami.io/vgpu-time": "1700000000",
            "hami.io/vgpu-devices-to-allocate": ";",
            "hami.io/vgpu-devices-allocated": ALLOCATED,
            "hami.io/bind-phase": "success",
            "hami.io/bind-time": "1700000000",
            "nvidia.com/use-gputype": "A100",
            "hami.io/node-scheduler-policy": "binpack",
            "team.example.com/owner": "alice",
        },
    },
    "spec": {
        "schedulerName": "hami-scheduler",
        "nodeName": "n1",
        "containers": [{"name": "c", "image": "x"}],
    },
}
BUSYBOX: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "bb", "namespace": "team"},
    "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}]},
}


def policy_and_binding(values: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    rendered = render(values)
    return (
        rendered.component("ValidatingAdmissionPolicy", COMPONENT),
        rendered.component("ValidatingAdmissionPolicyBinding", COMPONENT),
    )


def admission(
    user: str,
    new: dict[str, Any],
    old: dict[str, Any] | None = None,
    *,
    subresource: str = "",
) -> dict[str, Any]:
    """An AdmissionRequest for a pod write, as kube-apiserver hands it to a policy."""
    meta = new["metadata"]
    return {
        "uid": "u1",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "subResource": subresource,
        "name": meta["name"],
        "namespace": meta["namespace"],
        "operation": "CREATE" if old is None else "UPDATE",
        "userInfo": {"username": user, "groups": ["system:authenticated"]},
        "object": new,
        "oldObject": old,
        "dryRun": False,
    }


def changed(
    pod: dict[str, Any], annotations: dict[str, str | None] | None = None, **labels: str | None
) -> dict[str, Any]:
    """A copy of ``pod`` with annotations/labels set (None removes one)."""
    result = copy.deepcopy(pod)
    for field, changes in (("annotations", annotations or {}), ("labels", labels)):
        target = result["metadata"].setdefault(field, {})
        for key, value in changes.items():
            if value is None:
                target.pop(key, None)
            else:
                target[key] = value
    return result


#: The same pod between bind and Allocate.
ALLOCATING = changed(
    RUNNING, {"hami.io/vgpu-devices-to-allocate": ALLOCATED, "hami.io/bind-phase": "allocating"}
)


def verdict(request: dict[str, Any], values: dict[str, Any] | None = None) -> Denial | None:
    return review([policy_and_binding(values)[0]], [policy_and_binding(values)[1]], request)


def refusal(key: str, user: str, *, create: bool = False, label: bool = False) -> str:
    what = (
        f"label {key} is written by HAMi only (its scheduler)"
        if label
        else (f"annotation {key} is written by HAMi only (its scheduler and node agent)")
    )
    tail = "a new pod may not carry it" if create else f"{user} may not set, change or remove it"
    return (
        "ValidatingAdmissionPolicy 'hami-annotations' with binding 'hami-annotations' denied request: "
        f"{what}; {tail}"
    )


# ------------------------------------------------------------------ the attacks of finding 2 (refused)

ATTACKS: list[tuple[str, dict[str, Any], str]] = [
    (
        "owner shrinks vgpu-devices-allocated (over-booking)",
        admission(OWNER, changed(RUNNING, {"hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,1,1:;"}), RUNNING),
        refusal("hami.io/vgpu-devices-allocated", OWNER),
    ),
    (
        "owner deletes vgpu-node (usage vanishes)",
        admission(OWNER, changed(RUNNING, {"hami.io/vgpu-node": None}), RUNNING),
        refusal("hami.io/vgpu-node", OWNER),
    ),
    (
        "vgpu-node and fake entries on a busybox pod (blocks a node)",
        admission(
            OWNER,
            changed(BUSYBOX, {"hami.io/vgpu-node": "n1", "hami.io/vgpu-devices-allocated": ALLOCATED}),
            BUSYBOX,
        ),
        refusal("{hami.io/vgpu-node, hami.io/vgpu-devices-allocated}", OWNER),
    ),
    (
        "owner rewrites vgpu-devices-to-allocate between bind and Allocate (another pod's card)",
        admission(
            OWNER,
            changed(ALLOCATING, {"hami.io/vgpu-devices-to-allocate": "GPU-b,NVIDIA,3000,30:;"}),
            ALLOCATING,
        ),
        refusal("hami.io/vgpu-devices-to-allocate", OWNER),
    ),
    (
        "the vgpu-node label on a busybox pod",
        admission(OWNER, changed(BUSYBOX, None, **{POD_VGPU_NODE: "n1"}), BUSYBOX),
        refusal(POD_VGPU_NODE, OWNER, label=True),
    ),
    (
        "the vgpu-node label removed",
        admission(OWNER, changed(RUNNING, **{POD_VGPU_NODE: None}), RUNNING),
        refusal(POD_VGPU_NODE, OWNER, label=True),
    ),
    (
        "a new pod carrying an allocation (webhook bypassed: ignored namespace, Ignore policy, outage)",
        admission(OWNER, changed(BUSYBOX, {"hami.io/vgpu-node": "n1"})),
        refusal("hami.io/vgpu-node", OWNER, create=True),
    ),
    (
        "a new pod carrying the vgpu-node label",
        admission(OWNER, changed(BUSYBOX, None, **{POD_VGPU_NODE: "n1"})),
        refusal(POD_VGPU_NODE, OWNER, create=True, label=True),
    ),
    (
        "through the status subresource (it keeps the metadata a client sends)",
        admission(
            "system:node:n1",
            changed(RUNNING, {"hami.io/bind-phase": "failed"}),
            RUNNING,
            subresource="status",
        ),
        refusal("hami.io/bind-phase", "system:node:n1"),
    ),
    (
        "a hami.io/ key HAMi may add later",
        admission(OWNER, changed(RUNNING, {"hami.io/vgpu-future": "x"}), RUNNING),
        refusal("hami.io/vgpu-future", OWNER),
    ),
    (
        "a cluster admin (repairs go through the binding: docs/security.md)",
        admission("kubernetes-admin", changed(RUNNING, {"hami.io/bind-phase": "failed"}), RUNNING),
        refusal("hami.io/bind-phase", "kubernetes-admin"),
    ),
    (
        "an account of the same name in another namespace",
        admission(
            "system:serviceaccount:team:hami-scheduler",
            changed(RUNNING, {"hami.io/vgpu-devices-allocated": ";"}),
            RUNNING,
        ),
        refusal("hami.io/vgpu-devices-allocated", "system:serviceaccount:team:hami-scheduler"),
    ),
]


@pytest.mark.parametrize(("request_", "message"), [a[1:] for a in ATTACKS], ids=[a[0] for a in ATTACKS])
def test_attacks_are_refused(request_: dict[str, Any], message: str) -> None:
    denial = verdict(request_)
    assert denial is not None
    assert (denial.code, denial.reason) == (403, "Forbidden")
    if "{" in message:  # several keys: named in the order the API server walks the map (unordered)
        head, _, rest = message.partition("{")
        names, _, tail = rest.partition("}")
        assert denial.message.startswith(head) and denial.message.endswith(tail), denial.message
        listed = denial.message[len(head) : len(denial.message) - len(tail)]
        assert sorted(listed.split(", ")) == sorted(names.split(", "))
    else:
        assert denial.message == message


# ---------------------------------------------------------------- what must keep working (allowed)

BOUND = changed(
    BUSYBOX,
    {
        "hami.io/vgpu-node": "n1",
        "hami.io/vgpu-time": "1700000000",
        "hami.io/vgpu-devices-to-allocate": ALLOCATED,
        "hami.io/vgpu-devices-allocated": ALLOCATED,
        "hami.io/bind-phase": "allocating",
        "hami.io/bind-time": "1700000000",
    },
    **{POD_VGPU_NODE: "n1"},
)
ALLOWED: list[tuple[str, dict[str, Any]]] = [
    ("the scheduler's bind writes every key and the label", admission(SCHEDULER, BOUND, BUSYBOX)),
    (
        "the agent blanks to-allocate and records success",
        admission(
            AGENT,
            changed(BOUND, {"hami.io/vgpu-devices-to-allocate": ";", "hami.io/bind-phase": "success"}),
            BOUND,
        ),
    ),
    (
        "the agent records MIG instances",
        admission(AGENT, changed(BOUND, {"hami.io/vgpu-mig-allocations": "[]"}), BOUND),
    ),
    (
        "the scheduler clears a failed bind",
        admission(
            SCHEDULER, changed(BOUND, {"hami.io/bind-phase": "failed"}, **{POD_VGPU_NODE: None}), BOUND
        ),
    ),
    (
        "an unrelated annotation and label",
        admission(
            OWNER,
            changed(RUNNING, {"team.example.com/owner": "bob", "x": "1"}, app="infer", tier="2"),
            RUNNING,
        ),
    ),
    (
        "steering annotations are the user's (nvidia.com/ and the three hami.io/ ones)",
        admission(
            OWNER,
            changed(
                RUNNING,
                {
                    "nvidia.com/use-gputype": "H100",
                    "nvidia.com/nouse-gpuuuid": "GPU-x",
                    "hami.io/node-scheduler-policy": "spread",
                    "hami.io/gpu-scheduler-policy": "binpack",
                    "hami.io/device-scoring-weights": "slot=1,core=1,memory=1",
                },
            ),
            RUNNING,
        ),
    ),
    (
        "a user steering key removed",
        admission(OWNER, changed(RUNNING, {"hami.io/node-scheduler-policy": None}), RUNNING),
    ),
    (
        "an update that keeps HAMi's keys (spec, ownerReferences)",
        admission(OWNER, {**RUNNING, "spec": {**RUNNING["spec"], "activeDeadlineSeconds": 60}}, RUNNING),
    ),
    (
        "kubelet's status update",
        admission(
            "system:node:n1", {**RUNNING, "status": {"phase": "Running"}}, RUNNING, subresource="status"
        ),
    ),
    (
        "a new pod with steering annotations only",
        admission(
            OWNER,
            changed(BUSYBOX, {"nvidia.com/use-gputype": "A100", "hami.io/gpu-scheduler-policy": "spread"}),
        ),
    ),
    ("a new pod without metadata maps", admission(OWNER, BUSYBOX)),
]


@pytest.mark.parametrize("request_", [a[1] for a in ALLOWED], ids=[a[0] for a in ALLOWED])
def test_hami_and_ordinary_writes_are_allowed(request_: dict[str, Any]) -> None:
    assert verdict(request_) is None


def test_other_operations_and_resources_are_not_judged() -> None:
    deleting = {
        **admission(OWNER, changed(RUNNING, {"hami.io/vgpu-node": None}), RUNNING),
        "operation": "DELETE",
    }
    assert verdict(deleting) is None
    binding = admission(OWNER, changed(BUSYBOX, {"hami.io/vgpu-node": "n1"}), subresource="binding")
    assert verdict(binding) is None
    node = {
        **admission(OWNER, changed(BUSYBOX, {"hami.io/vgpu-node": "n1"})),
        "resource": {"group": "", "version": "v1", "resource": "nodes"},
    }
    assert verdict(node) is None


# ----------------------------------------------------------------------- consistency with the codec

HAMI_POD_KEYS = {
    value
    for name, value in vars(keys).items()
    if name.startswith("POD_") and isinstance(value, str) and value.startswith("hami.io/")
}
USER_KEYS = HAMI_POD_KEYS - set(INTERNAL_POD_ANNOTATIONS)


@pytest.mark.parametrize("key", INTERNAL_POD_ANNOTATIONS)
@pytest.mark.parametrize("change", ["set", "changed", "removed", "created"])
def test_every_internal_key_of_the_codec_is_covered(key: str, change: str) -> None:
    carrying = changed(BUSYBOX, {key: "v"})
    request_ = {
        "set": admission(OWNER, carrying, BUSYBOX),
        "changed": admission(OWNER, changed(carrying, {key: "w"}), carrying),
        "removed": admission(OWNER, BUSYBOX, carrying),
        "created": admission(OWNER, carrying),
    }[change]
    denial = verdict(request_)
    assert denial is not None and denial.code == 403
    assert denial.message == refusal(key, OWNER, create=change == "created")
    for writer in (SCHEDULER, AGENT):
        assert verdict({**request_, "userInfo": {"username": writer}}) is None


def test_exempt_keys_are_exactly_the_codecs_user_keys() -> None:
    assert {
        keys.POD_NODE_POLICY,
        keys.POD_GPU_POLICY,
        keys.POD_SCORING_WEIGHTS,
        keys.POD_REQUIRE_ENFORCEMENT,
    } == USER_KEYS
    policy, _ = policy_and_binding()
    (user_keys,) = [v["expression"] for v in policy["spec"]["variables"] if v["name"] == "userKeys"]
    assert sorted(cel.evaluate(user_keys)) == sorted(USER_KEYS)
    for key in USER_KEYS:
        assert verdict(admission(OWNER, changed(RUNNING, {key: "changed"}), RUNNING)) is None


# ----------------------------------------------------------------------------- wiring and values


@pytest.mark.parametrize("value_set", list(VALUE_SETS))
def test_writers_are_the_accounts_the_scheduler_and_agent_run_as(value_set: str) -> None:
    values = VALUE_SETS[value_set]
    rendered = render(values)
    policy, binding = policy_and_binding(values)
    accounts = [pod_spec(rendered.component("Deployment", "scheduler"))["serviceAccountName"]]
    if values.get("nodeAgent", {}).get("enabled", True):
        accounts.append(pod_spec(rendered.component("DaemonSet", "node-agent"))["serviceAccountName"])
    (writers,) = [v["expression"] for v in policy["spec"]["variables"] if v["name"] == "writers"]
    assert cel.evaluate(writers) == [service_account(NAMESPACE, a) for a in accounts]
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"


def test_the_embedded_cluster_enforces_the_rendered_policy() -> None:
    """One source: the simulation builds the very policy the chart renders (same file, same writers)."""
    policy, binding = policy_and_binding()
    ours, our_binding = annotation_policy([SCHEDULER, AGENT])
    assert ours["spec"] == policy["spec"]
    assert our_binding["spec"] == binding["spec"]
    assert ours["metadata"]["name"] == policy["metadata"]["name"]


def test_the_policy_can_be_turned_off() -> None:
    rendered = render({"webhook": {"annotationPolicy": {"enabled": False}}})
    for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
        assert [
            d for d in rendered.of_kind(kind) if labels(d).get("app.kubernetes.io/component") == COMPONENT
        ] == []


@pytest.mark.parametrize(
    ("kube_version", "enabled", "refused"),
    [("v1.29.9", True, True), ("v1.28.0", True, True), ("v1.30.0", True, False), ("v1.29.9", False, False)],
)
def test_older_clusters_are_told_to_upgrade_or_opt_out(
    capfd: pytest.CaptureFixture[str], kube_version: str, enabled: bool, refused: bool
) -> None:
    """Helm's lint mode logs a template's ``fail`` instead of raising; the log is the evidence here."""
    values = {"webhook": {"annotationPolicy": {"enabled": enabled}}}
    helm.lint(str(CHART), values, namespace=NAMESPACE, kube_version=kube_version)
    logged = capfd.readouterr()
    assert ("webhook.annotationPolicy needs Kubernetes >= 1.30" in logged.out + logged.err) is refused
