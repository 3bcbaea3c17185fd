"""The pure admission decision (docs/protocol.md, "Admission"): tables of pods -> spec changes or refusal
messages."""

from __future__ import annotations

from dataclasses import replace
from pathlib import PurePosixPath
from typing import Any

import pytest

from hami.annotations import INTERNAL_POD_ANNOTATIONS
from hami.core.quota import QuotaAsk
from hami.settings import DeviceConfig, ResourceNames
from nodeagent.allocate_rules import hook_mounts
from webhook.config import MutationSettings
from webhook.mutation import REFUSAL_REASONS, Admit, Refuse, apply, plan

from .webhook_cases import (
    CORES,
    DEFAULT,
    GPU,
    GPU_POLICY,
    MEM,
    NODE_POLICY,
    NUMA_BIND,
    PCT,
    PRIO,
    REFUSALS,
    WEIGHTS,
    ctr,
    disable_control,
    make_pod,
    unisolated,
    visible_devices,
    visible_in_gpu_container,
    visible_without_gpu,
)


def admitted(pod: dict[str, Any], settings: MutationSettings = DEFAULT) -> dict[str, Any]:
    """The pod as stored after the plan; fails the test on a refusal."""
    decision = plan(pod, settings)
    assert isinstance(decision, Admit), decision
    return apply(pod, decision)


def limits_of(pod: dict[str, Any], index: int = 0, key: str = "containers") -> dict[str, str]:
    limits: dict[str, str] = pod["spec"][key][index]["resources"]["limits"]
    return limits


# ------------------------------------------------------------------------------------------ mutations


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        # a bare card request is exclusive: gpucores 100 means "needs an unused card"
        # (docs/protocol.md, "Fit")
        ({GPU: "1"}, {GPU: "1", CORES: "100"}),
        ({GPU: "2"}, {GPU: "2", CORES: "100"}),
        # memory keeps the card shareable: nothing to add
        ({GPU: "1", MEM: "3000"}, {GPU: "1", MEM: "3000"}),
        ({GPU: "1", PCT: "50"}, {GPU: "1", PCT: "50"}),
        # a 100 % memory share is a whole card, hence exclusive too
        ({GPU: "1", PCT: "100"}, {GPU: "1", PCT: "100", CORES: "100"}),
        # cores given: left alone
        ({GPU: "1", CORES: "30"}, {GPU: "1", CORES: "30"}),
        # only memory/cores: the count defaults to defaultGPUNum (1)
        ({MEM: "3000"}, {MEM: "3000", GPU: "1"}),
        ({CORES: "40"}, {CORES: "40", GPU: "1"}),
        ({PCT: "100"}, {PCT: "100", GPU: "1", CORES: "100"}),
        ({PCT: "25"}, {PCT: "25", GPU: "1"}),
    ],
)
def test_limits_defaults(limits: dict[str, str], expected: dict[str, str]) -> None:
    result = admitted(make_pod(ctr(limits=dict(limits))))
    assert limits_of(result) == expected
    assert result["spec"]["schedulerName"] == "hami-scheduler"


def test_bare_card_changes_exactly_scheduler_and_cores() -> None:
    decision = plan(make_pod(ctr(limits={GPU: "1"})), DEFAULT)
    assert decision == Admit(
        spec={
            "containers": [
                {"name": "main", "image": "cuda:12", "resources": {"limits": {GPU: "1", CORES: "100"}}}
            ],
            "schedulerName": "hami-scheduler",
        },
        notes=(
            "container main: nvidia.com/gpucores set to 100 (a whole card)",
            "schedulerName set to hami-scheduler",
        ),
        quota_ask=QuotaAsk(memory=0, cores=100),  # the exclusive default counts against a cores quota
    )


def test_the_submitted_pod_is_not_modified() -> None:
    pod = make_pod(ctr(limits={GPU: "1"}))
    plan(pod, DEFAULT)
    assert pod == make_pod(ctr(limits={GPU: "1"}))


def test_unchanged_containers_are_not_in_the_plan() -> None:
    decision = plan(make_pod(ctr(limits={GPU: "1", MEM: "1000"})), DEFAULT)
    assert isinstance(decision, Admit)
    assert decision.spec == {"schedulerName": "hami-scheduler"}


def test_count_in_requests_counts_as_a_card_request() -> None:
    pod = make_pod({"name": "main", "resources": {"requests": {GPU: "1"}, "limits": {MEM: "1000"}}})
    result = admitted(pod)
    assert result["spec"]["schedulerName"] == "hami-scheduler"
    assert GPU not in limits_of(result)  # not injected: the count is given (in requests)


def test_default_gpu_num_is_configurable() -> None:
    settings = replace(DEFAULT, device=DeviceConfig(default_gpu_num=2))
    assert limits_of(admitted(make_pod(ctr(limits={MEM: "1000"})), settings))[GPU] == "2"


def test_exclusive_when_no_memory_resource_is_configured() -> None:
    # With the memory resource name unset, HAMi treats a card without a percentage as exclusive.
    device = DeviceConfig(resources=ResourceNames(memory=""))
    settings = replace(DEFAULT, device=device)
    assert limits_of(admitted(make_pod(ctr(limits={GPU: "1"})), settings))[CORES] == "100"


def test_priority_becomes_env() -> None:
    result = admitted(make_pod(ctr(limits={GPU: "1", MEM: "1000", PRIO: "1"})))
    assert result["spec"]["containers"][0]["env"] == [{"name": "CUDA_TASK_PRIORITY", "value": "1"}]


def test_existing_env_entry_is_replaced_in_place() -> None:
    env = [
        {"name": "A", "value": "x"},
        {"name": "CUDA_TASK_PRIORITY", "value": "0"},
        {"name": "B", "value": "y"},
    ]
    result = admitted(make_pod(ctr(limits={GPU: "1", MEM: "1000", PRIO: "1"}, env=env)))
    assert result["spec"]["containers"][0]["env"] == [
        {"name": "A", "value": "x"},
        {"name": "CUDA_TASK_PRIORITY", "value": "1"},
        {"name": "B", "value": "y"},
    ]


FORCE_ENV = [{"name": "GPU_CORE_UTILIZATION_POLICY", "value": "force"}]


@pytest.mark.parametrize(("policy", "env"), [("force", FORCE_ENV), ("default", None), ("", None)])
def test_core_policy_env(policy: str, env: list[dict[str, str]] | None) -> None:
    settings = replace(DEFAULT, device=DeviceConfig(gpu_core_policy=policy))
    result = admitted(make_pod(ctr(limits={GPU: "1", MEM: "1000"})), settings)
    assert result["spec"]["containers"][0].get("env") == env


def test_runtime_class_set_when_configured_and_absent() -> None:
    settings = replace(DEFAULT, device=DeviceConfig(runtime_class_name="nvidia"))
    assert admitted(make_pod(ctr(limits={GPU: "1"})), settings)["spec"]["runtimeClassName"] == "nvidia"
    kept = admitted(make_pod(ctr(limits={GPU: "1"}), runtimeClassName="kata"), settings)
    assert kept["spec"]["runtimeClassName"] == "kata"
    # no runtime class on pods that ask for no card
    decision = plan(make_pod(ctr(limits={"cpu": "1"})), settings)
    assert decision == Admit(notes=("no container asks for a managed resource",))


def test_overwrite_env_hides_cards_from_other_containers_of_a_gpu_pod() -> None:
    settings = replace(DEFAULT, device=DeviceConfig(overwrite_env=True))
    result = admitted(
        make_pod(ctr(limits={GPU: "1", MEM: "1"}), ctr("sidecar", limits={"cpu": "1"})), settings
    )
    assert "env" not in result["spec"]["containers"][0]
    assert result["spec"]["containers"][1]["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}]


def test_init_containers_are_mutated_and_route_the_pod() -> None:
    pod = make_pod(ctr("app", limits={"cpu": "1"}), init=(ctr("warmup", limits={GPU: "1"}),))
    result = admitted(pod)
    assert limits_of(result, key="initContainers") == {GPU: "1", CORES: "100"}
    assert result["spec"]["containers"] == pod["spec"]["containers"]
    assert result["spec"]["schedulerName"] == "hami-scheduler"


@pytest.mark.parametrize("scheduler", ["", "default-scheduler", "hami-scheduler"])
def test_our_pods_get_our_scheduler(scheduler: str) -> None:
    spec: dict[str, Any] = {"schedulerName": scheduler} if scheduler else {}
    pod = make_pod(ctr(limits={GPU: "1", MEM: "1"}), **spec)
    assert admitted(pod)["spec"]["schedulerName"] == "hami-scheduler"


def test_already_ours_needs_no_scheduler_change() -> None:
    decision = plan(make_pod(ctr(limits={GPU: "1", MEM: "1"}), schedulerName="hami-scheduler"), DEFAULT)
    assert decision == Admit(spec={}, notes=(), quota_ask=QuotaAsk(memory=1, cores=0))


BAD_STEERING = {NUMA_BIND: "yes", NODE_POLICY: "pack", GPU_POLICY: "pack", WEIGHTS: "slot=1"}

UNTOUCHED: list[tuple[str, dict[str, Any], MutationSettings, str]] = [
    ("no GPU", make_pod(ctr(limits={"cpu": "1"})), DEFAULT, "no container asks for a managed resource"),
    (
        "privileged without GPU",
        make_pod(ctr(limits={"cpu": "1"}, securityContext={"privileged": True})),
        DEFAULT,
        "no container asks for a managed resource",
    ),
    (
        "foreign scheduler",
        make_pod(ctr(limits={GPU: "1"}), schedulerName="volcano"),
        DEFAULT,
        "scheduler 'volcano' is not ours",
    ),
    (
        "default-scheduler without forcing",
        make_pod(ctr(limits={GPU: "1"}), schedulerName="default-scheduler"),
        replace(DEFAULT, force_overwrite_default_scheduler=False),
        "scheduler 'default-scheduler' is not ours",
    ),
    (
        "no GPU, with unreadable steering annotations",
        make_pod(ctr(limits={"cpu": "1"}), annotations=BAD_STEERING),
        DEFAULT,
        "no container asks for a managed resource",
    ),
    (
        "foreign scheduler, with unreadable steering annotations",
        make_pod(ctr(limits={GPU: "1"}), schedulerName="volcano", annotations=BAD_STEERING),
        DEFAULT,
        "scheduler 'volcano' is not ours",
    ),
    (
        "ignored by label, even with bad values",
        make_pod(ctr(limits={GPU: "99", CORES: "500"}), labels={"hami.io/webhook": "ignore"}),
        DEFAULT,
        "pod labelled hami.io/webhook=ignore",
    ),
]


@pytest.mark.parametrize(
    ("pod", "settings", "note"), [c[1:] for c in UNTOUCHED], ids=[c[0] for c in UNTOUCHED]
)
def test_untouched(pod: dict[str, Any], settings: MutationSettings, note: str) -> None:
    assert plan(pod, settings) == Admit(notes=(note,))


# ------------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("pod", "message", "code", "reason"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS]
)
def test_refusals(pod: dict[str, Any], message: str, code: int, reason: str) -> None:
    assert plan(pod, DEFAULT) == Refuse(message=message, code=code, reason=reason)
    assert reason in REFUSAL_REASONS


def test_count_zero_default_refuses_memory_only() -> None:
    settings = replace(DEFAULT, device=DeviceConfig(default_gpu_num=0))
    assert plan(make_pod(ctr("t", limits={MEM: "1000"})), settings) == Refuse(
        message='container "t": asks for nvidia.com/gpumem without nvidia.com/gpu, '
        "and defaultGPUNum is 0; set the card count",
        code=422,
        reason="no_card_count",
    )


def test_max_cards_is_configurable() -> None:
    settings = replace(DEFAULT, max_cards_per_container=4)
    assert isinstance(plan(make_pod(ctr(limits={GPU: "4"})), settings), Admit)
    assert plan(make_pod(ctr("t", limits={GPU: "5"})), settings) == Refuse(
        message='container "t": nvidia.com/gpu "5" asks for more than 4 cards',
        code=422,
        reason="too_many_cards",
    )


@pytest.mark.parametrize("key", INTERNAL_POD_ANNOTATIONS)
@pytest.mark.parametrize(
    "pod_kind",
    ["gpu", "no-gpu", "ignored", "foreign-scheduler"],
)
def test_forged_internal_annotation_refused_on_every_new_pod(key: str, pod_kind: str) -> None:
    limits = {"cpu": "1"} if pod_kind == "no-gpu" else {GPU: "1"}
    extra: dict[str, Any] = {"schedulerName": "volcano"} if pod_kind == "foreign-scheduler" else {}
    labels = {"hami.io/webhook": "ignore"} if pod_kind == "ignored" else None
    pod = make_pod(ctr(limits=limits), annotations={key: "forged", "other": "x"}, labels=labels, **extra)
    assert plan(pod, DEFAULT) == Refuse(
        message=f"annotation {key} is written by HAMi only; a new pod may not carry it",
        code=403,
        reason="forged_annotation",
    )


def test_all_forged_keys_are_listed() -> None:
    pod = make_pod(
        ctr(limits={GPU: "1"}), annotations={"hami.io/bind-phase": "success", "hami.io/vgpu-node": "n"}
    )
    assert plan(pod, DEFAULT) == Refuse(
        message="annotation hami.io/vgpu-node is written by HAMi only; "
        "annotation hami.io/bind-phase is written by HAMi only; a new pod may not carry it",
        code=403,
        reason="forged_annotation",
    )


def test_user_steering_annotations_are_welcome() -> None:
    pod = make_pod(ctr(limits={GPU: "1"}), annotations={"nvidia.com/use-gputype": "A100"})
    assert isinstance(plan(pod, DEFAULT), Admit)


@pytest.mark.parametrize(
    "annotations",
    [
        {NUMA_BIND: "true", NODE_POLICY: "spread", GPU_POLICY: "binpack", WEIGHTS: "slot=1,core=2,memory=0"},
        {NUMA_BIND: "0", NODE_POLICY: " binpack ", GPU_POLICY: " binpack , numa ", WEIGHTS: ""},
        {NUMA_BIND: "True", NODE_POLICY: "", GPU_POLICY: "topology-aware"},
        {GPU_POLICY: "mutex"},
        {GPU_POLICY: "numa"},
        {GPU_POLICY: "spread,numa,"},  # an empty entry is dropped, as the scheduler does
        {GPU_POLICY: "   ", NODE_POLICY: "", NUMA_BIND: " "},  # blank: the scheduler's defaults
        {WEIGHTS: " memory = 3 , slot=0,core=0"},
    ],
)
def test_readable_steering_annotations_are_admitted(annotations: dict[str, str]) -> None:
    decision = plan(make_pod(ctr(limits={GPU: "1"}), annotations=annotations), DEFAULT)
    assert isinstance(decision, Admit)
    assert decision.spec["schedulerName"] == "hami-scheduler"


def test_bad_annotation_on_a_gpu_pod_with_an_unusable_count_is_still_named() -> None:
    # the container's value problem makes it ask for nothing, yet the pod is a GPU pod
    pod = make_pod(ctr("t", limits={GPU: "x"}), annotations={NODE_POLICY: "Spread"})
    decision = plan(pod, DEFAULT)
    assert isinstance(decision, Refuse)
    assert decision.reason == "bad_gpu"
    assert decision.message.endswith(
        'annotation hami.io/node-scheduler-policy "Spread": unknown node policy; expected binpack, spread or '
        "fragmentation"
    )


# ------------------------------------------------------------------------- CUDA_DISABLE_CONTROL (pain 9)

WHOLE_CARDS: list[tuple[str, dict[str, str], dict[str, str]]] = [
    # (id, limits as written, limits as stored): the exclusive default makes a bare card whole
    ("bare card", {GPU: "1"}, {GPU: "1", CORES: "100"}),
    ("two bare cards", {GPU: "2"}, {GPU: "2", CORES: "100"}),
    ("all cores, memory not limited", {GPU: "1", CORES: "100"}, {GPU: "1", CORES: "100"}),
    ("full memory share", {GPU: "1", PCT: "100"}, {GPU: "1", PCT: "100", CORES: "100"}),
    (
        "all cores and full memory share",
        {GPU: "1", CORES: "100", PCT: "100"},
        {GPU: "1", CORES: "100", PCT: "100"},
    ),
    ("count defaulted from a full share", {PCT: "100"}, {PCT: "100", GPU: "1", CORES: "100"}),
]


@pytest.mark.parametrize(("limits", "stored"), [c[1:] for c in WHOLE_CARDS], ids=[c[0] for c in WHOLE_CARDS])
@pytest.mark.parametrize("value", ["1", "t", "T", "true", "TRUE", "True"])
def test_isolation_may_be_disabled_on_whole_cards(
    limits: dict[str, str], stored: dict[str, str], value: str
) -> None:
    result = admitted(make_pod(ctr(limits=dict(limits), env=disable_control(value))))
    assert limits_of(result) == stored
    assert result["spec"]["containers"][0]["env"] == disable_control(value)  # kept as written


SHARED = {GPU: "1", MEM: "3000"}


@pytest.mark.parametrize(
    "env",
    [
        # not a Go ParseBool true: HAMi-core stays loaded, so nothing escapes its limits
        *(
            disable_control(v)
            for v in ["0", "f", "F", "false", "FALSE", "False", "", "yes", "on", " true", "true ", "tRUE"]
        ),
        # a value from elsewhere cannot be judged at admission (documented as not checked)
        [{"name": "CUDA_DISABLE_CONTROL", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}],
        [{"name": "CUDA_DISABLE_CONTROL_X", "value": "true"}, {"name": "cuda_disable_control", "value": "1"}],
    ],
)
def test_isolation_kept_on_shared_cards_is_admitted(env: list[dict[str, Any]]) -> None:
    result = admitted(make_pod(ctr(limits=dict(SHARED), env=env)))
    assert result["spec"]["schedulerName"] == "hami-scheduler"
    assert result["spec"]["containers"][0]["env"] == env


def test_isolation_disabled_in_a_container_without_cards_is_admitted() -> None:
    # a sidecar of a GPU pod gets no card, hence no HAMi-core; a GPU-less pod is not ours at all
    pod = make_pod(
        ctr("train", limits=dict(SHARED)), ctr("side", limits={"cpu": "1"}, env=disable_control("true"))
    )
    assert admitted(pod)["spec"]["containers"][1]["env"] == disable_control("true")
    alone = make_pod(ctr("side", limits={"cpu": "1"}, env=disable_control("true")))
    assert plan(alone, DEFAULT) == Admit(notes=("no container asks for a managed resource",))


def test_isolation_checked_only_after_privilege() -> None:
    pod = make_pod(
        ctr("t", limits=dict(SHARED), env=disable_control("1"), securityContext={"privileged": True})
    )
    assert plan(pod, DEFAULT) == Refuse(message="container t is privileged", code=403, reason="privileged")


def test_isolation_with_default_memory_needs_a_full_share() -> None:
    # defaultMemory limits a bare card's memory, so "no gpumem" is no longer a whole card
    settings = replace(DEFAULT, device=DeviceConfig(default_memory=4000))
    refused = plan(make_pod(ctr("t", limits={GPU: "1"}, env=disable_control("true"))), settings)
    assert refused == Refuse(
        message=unisolated("t", "true", memory_advice="nvidia.com/gpumem-percentage: 100"),
        code=403,
        reason="isolation_disabled",
    )
    whole = make_pod(ctr("t", limits={GPU: "1", PCT: "100"}, env=disable_control("true")))
    assert isinstance(plan(whole, settings), Admit)


def test_isolation_uses_the_configured_resource_names() -> None:
    names = ResourceNames(
        memory="example.com/mem", memory_percentage="example.com/pct", cores="example.com/cores"
    )
    settings = replace(DEFAULT, device=DeviceConfig(resources=names))
    pod = make_pod(ctr("t", limits={GPU: "1", "example.com/mem": "10"}, env=disable_control("1")))
    decision = plan(pod, settings)
    assert isinstance(decision, Refuse)
    assert decision.message.endswith(
        "with example.com/cores: 100 and no example.com/mem (or example.com/pct: 100)"
    )
    whole = make_pod(ctr("t", limits={GPU: "1", "example.com/cores": "100"}, env=disable_control("1")))
    assert isinstance(plan(whole, settings), Admit)


@pytest.mark.parametrize(
    "value",
    ["1", "t", "T", "true", "TRUE", "True", "0", "false", "", "yes", "on", "y", " 1", "true ", "tRUE", "2"],
)
def test_isolation_rule_agrees_with_the_node_agent(value: str) -> None:
    """Refused on a shared card exactly when the node agent would skip the ``/etc/ld.so.preload`` mount."""
    container = ctr("t", limits=dict(SHARED), env=disable_control(value))
    mounts = hook_mounts(
        PurePosixPath("/usr/local/vgpu"), PurePosixPath("/x"), container, lock_dir="/l", licensed=False
    )
    preload = any(m.container_path == "/etc/ld.so.preload" for m in mounts)
    decision = plan(make_pod(container), DEFAULT)
    assert isinstance(decision, Refuse) == (not preload), decision


# ------------------------------------------- protective refusals on every GPU pod (issue 11, 3 and 5)

#: How a GPU pod can avoid our routing: (id, labels, spec fields). The webhook sees each of them.
UNROUTED: list[tuple[str, dict[str, str] | None, dict[str, Any]]] = [
    ("another scheduler", None, {"schedulerName": "volcano"}),
    ("default-scheduler, not forced", None, {"schedulerName": "default-scheduler"}),
    ("ignored", {"hami.io/webhook": "ignore"}, {}),
    ("ignored, naming our scheduler", {"hami.io/webhook": "ignore"}, {"schedulerName": "hami-scheduler"}),
]
NOT_FORCING = replace(DEFAULT, force_overwrite_default_scheduler=False)


@pytest.mark.parametrize(("labels", "spec"), [u[1:] for u in UNROUTED], ids=[u[0] for u in UNROUTED])
def test_isolation_is_refused_whatever_the_routing(
    labels: dict[str, str] | None, spec: dict[str, Any]
) -> None:
    pod = make_pod(ctr("t", limits=dict(SHARED), env=disable_control("1")), labels=labels, **spec)
    assert plan(pod, NOT_FORCING) == Refuse(
        message=unisolated("t", "1"), code=403, reason="isolation_disabled"
    )


@pytest.mark.parametrize(("labels", "spec"), [u[1:] for u in UNROUTED], ids=[u[0] for u in UNROUTED])
def test_visible_devices_are_refused_whatever_the_routing(
    labels: dict[str, str] | None, spec: dict[str, Any]
) -> None:
    gpu = make_pod(ctr("t", limits={GPU: "1"}, env=visible_devices("all")), labels=labels, **spec)
    assert plan(gpu, NOT_FORCING) == Refuse(
        message=visible_in_gpu_container("t"), code=403, reason="visible_devices"
    )
    cpu = make_pod(ctr("c", env=visible_devices("all")), labels=labels, **spec)
    assert plan(cpu, NOT_FORCING) == Refuse(
        message=visible_without_gpu("c", '="all"'), code=403, reason="visible_devices"
    )


@pytest.mark.parametrize(("labels", "spec"), [u[1:] for u in UNROUTED], ids=[u[0] for u in UNROUTED])
def test_unrouted_pods_are_otherwise_untouched(labels: dict[str, str] | None, spec: dict[str, Any]) -> None:
    """Not our pods: no value checks, no privilege check, no defaults; a whole card may disable control."""
    for containers in (
        [ctr("t", limits={GPU: "99", CORES: "500"})],
        [ctr("t", limits={GPU: "1"}, securityContext={"privileged": True})],
        [ctr("t", limits={GPU: "1"}, env=disable_control("true"))],  # whole card once the default applies
        [ctr("t", limits={GPU: "1", MEM: "10"}), ctr("side", env=visible_devices("void"))],
    ):
        pod = make_pod(*containers, labels=labels, nodeName="n1", **spec)
        decision = plan(pod, NOT_FORCING)
        assert isinstance(decision, Admit) and decision.spec == {}, decision


@pytest.mark.parametrize("value", ["", "none", "void"])
def test_visible_devices_hiding_every_card_are_admitted_without_a_card(value: str) -> None:
    side = ctr("side", env=visible_devices(value))
    result = admitted(make_pod(ctr("train", limits=dict(SHARED)), side))
    assert result["spec"]["containers"][1]["env"] == visible_devices(value)
    assert plan(make_pod(side), DEFAULT) == Admit(notes=("no container asks for a managed resource",))


@pytest.mark.parametrize(
    "env",
    [
        [
            {"name": "nvidia_visible_devices", "value": "all"},
            {"name": "NVIDIA_VISIBLE_DEVICES_X", "value": "all"},
        ],
        [{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "all"}],
    ],
)
def test_only_the_exact_variable_is_judged(env: list[dict[str, str]]) -> None:
    assert isinstance(plan(make_pod(ctr("t", limits={GPU: "1"}, env=env)), DEFAULT), Admit)
    assert isinstance(plan(make_pod(ctr("c", env=env)), DEFAULT), Admit)


def test_env_from_cannot_be_judged_at_admission() -> None:
    """Documented limit: a ConfigMap or Secret named by ``envFrom`` is not read by the webhook."""
    env_from = [{"configMapRef": {"name": "gpu-env"}}]
    assert isinstance(plan(make_pod(ctr("t", limits=dict(SHARED), envFrom=env_from)), DEFAULT), Admit)


def test_visible_devices_use_the_configured_card_resource() -> None:
    settings = replace(DEFAULT, device=DeviceConfig(resources=ResourceNames(count="example.com/vgpu")))
    decision = plan(make_pod(ctr("c", env=visible_devices("all"))), settings)
    assert isinstance(decision, Refuse)
    assert "asks for no example.com/vgpu the node's cards" in decision.message
    gpu = make_pod(ctr("t", limits={"example.com/vgpu": "1"}, env=visible_devices("all")))
    assert plan(gpu, settings) == Refuse(
        message=visible_in_gpu_container("t"), code=403, reason="visible_devices"
    )


# --------------------------------------------- what a routed GPU pod asks of its namespace's quota


@pytest.mark.parametrize(
    ("pod", "settings", "ask"),
    [
        # as mutated: the defaulted count (defaultGPUNum) and the exclusive cores count
        (make_pod(ctr(limits={MEM: "3000"})), DEFAULT, QuotaAsk(memory=3000, cores=0)),
        (make_pod(ctr(limits={PCT: "100"})), DEFAULT, QuotaAsk(memory=0, cores=100)),
        (
            make_pod(ctr(limits={GPU: "2", MEM: "1000", CORES: "30"})),
            DEFAULT,
            QuotaAsk(memory=2000, cores=60),
        ),
        # init containers at their peak, app containers summed (HAMi's fitResourceQuota)
        (
            make_pod(
                ctr("a", limits={GPU: "1", MEM: "1000", CORES: "10"}),
                ctr("b", limits={GPU: "1", MEM: "1000", CORES: "10"}),
                init=(ctr("warm", limits={GPU: "1", MEM: "5000", CORES: "5"}),),
            ),
            DEFAULT,
            QuotaAsk(memory=5000, cores=20),
        ),
        # memoryFactor: MiB as booked (the quota's memory limit is multiplied alike)
        (
            make_pod(ctr(limits={GPU: "1", MEM: "300", CORES: "5"})),
            replace(DEFAULT, device=DeviceConfig(memory_factor=10)),
            QuotaAsk(memory=3000, cores=5),
        ),
        # a percentage is 0 MiB here and cores 0 ask nothing: no pre-check at all
        (make_pod(ctr(limits={GPU: "1", PCT: "50", CORES: "0"})), DEFAULT, None),
    ],
    ids=[
        "default-count",
        "default-count-and-cores",
        "shared",
        "init-peak",
        "memory-factor",
        "nothing-to-check",
    ],
)
def test_a_routed_gpu_pod_carries_its_quota_ask(
    pod: dict[str, Any], settings: MutationSettings, ask: QuotaAsk | None
) -> None:
    decision = plan(pod, settings)
    assert isinstance(decision, Admit)
    assert decision.quota_ask == ask


@pytest.mark.parametrize(
    "pod",
    [
        make_pod(ctr(limits={GPU: "1"}), schedulerName="volcano"),
        make_pod(ctr(limits={GPU: "1"}), labels={"hami.io/webhook": "ignore"}),
        make_pod(ctr(limits={"cpu": "1"})),
    ],
    ids=["foreign-scheduler", "ignored", "no-gpu"],
)
def test_pods_we_do_not_route_carry_no_quota_ask(pod: dict[str, Any]) -> None:
    decision = plan(pod, DEFAULT)
    assert isinstance(decision, Admit) and decision.quota_ask is None
