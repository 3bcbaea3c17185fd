"""Shared pod builders and the refusal table, used by the pure tests and the HTTPS tests alike."""

from __future__ import annotations

from typing import Any

from webhook.config import MutationSettings

DEFAULT = MutationSettings()


def ctr(name: str = "main", limits: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "image": "cuda:12"}
    if limits is not None:
        body["resources"] = {"limits": limits}
    body.update(extra)
    return body


def make_pod(
    *containers: dict[str, Any],
    init: tuple[dict[str, Any], ...] = (),
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "p", "namespace": "default"}
    if labels:
        metadata["labels"] = labels
    if annotations:
        metadata["annotations"] = annotations
    body: dict[str, Any] = {"containers": list(containers), **spec}
    if init:
        body["initContainers"] = list(init)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": body}


GPU, MEM, PCT, CORES, PRIO = (
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
    "nvidia.com/priority",
)
NUMA_BIND, NODE_POLICY, GPU_POLICY, WEIGHTS = (
    "nvidia.com/numa-bind",
    "hami.io/node-scheduler-policy",
    "hami.io/gpu-scheduler-policy",
    "hami.io/device-scoring-weights",
)


def disable_control(value: str) -> list[dict[str, str]]:
    """An ``env`` list setting ``CUDA_DISABLE_CONTROL`` (HAMi-core not loaded when it is true)."""
    return [{"name": "CUDA_DISABLE_CONTROL", "value": value}]


def unisolated(
    name: str, value: str, memory_advice: str = "no nvidia.com/gpumem (or nvidia.com/gpumem-percentage: 100)"
) -> str:
    """The refusal message for container ``name`` with ``CUDA_DISABLE_CONTROL=value`` on a shared card."""
    return (
        f'container "{name}": env CUDA_DISABLE_CONTROL="{value}" turns off '
        "HAMi-core's memory and core limits, "
        "so on a shared card it could take the whole card from its neighbours; drop the variable, "
        f"or ask for whole cards with nvidia.com/gpucores: 100 and {memory_advice}"
    )


def visible_devices(value: str | None = None, **source: Any) -> list[dict[str, Any]]:
    """An ``env`` list setting ``NVIDIA_VISIBLE_DEVICES`` to ``value`` (or from ``valueFrom=...``)."""
    entry: dict[str, Any] = {"name": "NVIDIA_VISIBLE_DEVICES", **source}
    if value is not None:
        entry["value"] = value
    return [entry]


def visible_in_gpu_container(name: str) -> str:
    """The refusal message for a GPU container that sets ``NVIDIA_VISIBLE_DEVICES`` itself."""
    return (
        f'container "{name}": env NVIDIA_VISIBLE_DEVICES is set by the node agent to the cards granted '
        "to this container; a value in the pod would replace that list and could reach cards granted to "
        "other pods; drop the variable"
    )


def visible_without_gpu(name: str, value: str) -> str:
    """The refusal message for a container without a card request that sets ``NVIDIA_VISIBLE_DEVICES``."""
    return (
        f'container "{name}": env NVIDIA_VISIBLE_DEVICES{value} would give a container that asks for no '
        "nvidia.com/gpu the node's cards (the NVIDIA container runtime reads it); ask for nvidia.com/gpu, "
        'or set it to "none" or "void"'
    )


#: (id, pod, message, status code, reason code of the metrics)
REFUSALS: list[tuple[str, dict[str, Any], str, int, str]] = [
    (
        "cores above 100",
        make_pod(ctr("train", limits={GPU: "1", CORES: "150"})),
        'container "train": nvidia.com/gpucores "150" must be between 0 and 100 (percent of a card)',
        422,
        "bad_gpucores",
    ),
    (
        "negative cores",
        make_pod(ctr("train", limits={GPU: "1", CORES: "-1"})),
        'container "train": nvidia.com/gpucores "-1" must not be negative',
        422,
        "bad_gpucores",
    ),
    (
        "percentage 0",
        make_pod(ctr("train", limits={GPU: "1", PCT: "0"})),
        'container "train": nvidia.com/gpumem-percentage "0" must be between 1 and 100 '
        "(percent of a card's memory)",
        422,
        "bad_gpumem_percentage",
    ),
    (
        "percentage above 100",
        make_pod(ctr("train", limits={GPU: "1", PCT: "101"})),
        'container "train": nvidia.com/gpumem-percentage "101" must be between 0 and 100',
        422,
        "bad_gpumem_percentage",
    ),
    (
        "memory in Gi",
        make_pod(ctr("train", limits={GPU: "1", MEM: "16Gi"})),
        'container "train": nvidia.com/gpumem "16Gi" is 17179869184 MiB, '
        "more than the maximum 2147483647 MiB (nvidia.com/gpumem counts MiB: write 16384 for 16 GiB)",
        422,
        "bad_gpumem",
    ),
    (
        "memory not whole",
        make_pod(ctr("train", limits={GPU: "1", MEM: "1.5"})),
        'container "train": nvidia.com/gpumem "1.5" is not a whole number of MiB',
        422,
        "bad_gpumem",
    ),
    (
        "memory not a quantity",
        make_pod(ctr("train", limits={GPU: "1", MEM: "lots"})),
        'container "train": nvidia.com/gpumem "lots" is not a quantity; write a whole number of MiB',
        422,
        "bad_gpumem",
    ),
    (
        "too many cards",
        make_pod(ctr("train", limits={GPU: "17"})),
        'container "train": nvidia.com/gpu "17" asks for more than 16 cards',
        422,
        "too_many_cards",
    ),
    (
        "fractional count",
        make_pod(ctr("train", limits={GPU: "1.5"})),
        'container "train": nvidia.com/gpu "1.5" is not a whole number',
        422,
        "bad_gpu",
    ),
    (
        "privileged GPU container",
        make_pod(ctr("train", limits={GPU: "1"}, securityContext={"privileged": True})),
        "container train is privileged",
        403,
        "privileged",
    ),
    (
        "privileged sidecar in a GPU pod",
        make_pod(ctr("train", limits={GPU: "1"}), ctr("debug", securityContext={"privileged": True})),
        "container debug is privileged",
        403,
        "privileged",
    ),
    (
        "node preset",
        make_pod(ctr(limits={GPU: "1"}), nodeName="gpu-1"),
        "pod has node assigned",
        403,
        "node_assigned",
    ),
    ("no containers", make_pod(), "pod has no containers", 400, "no_containers"),
    (
        "two problems, both named",
        make_pod(ctr("a", limits={GPU: "1", CORES: "101"}), ctr("b", limits={MEM: "2Gi"})),
        'container "a": nvidia.com/gpucores "101" must be between 0 and 100 (percent of a card); '
        'container "b": nvidia.com/gpumem "2Gi" is 2147483648 MiB, more than the maximum 2147483647 MiB '
        "(nvidia.com/gpumem counts MiB: write 16384 for 16 GiB)",
        422,
        "bad_gpucores",
    ),
    (
        "init container problem",
        make_pod(ctr("app"), init=(ctr("warm", limits={CORES: "-5"}),)),
        'container "warm": nvidia.com/gpucores "-5" must not be negative',
        422,
        "bad_gpucores",
    ),
    # steering annotations the scheduler would ignore (numa-bind, policies) or fail on forever (weights)
    (
        "numa-bind not a boolean",
        make_pod(ctr(limits={GPU: "1"}), annotations={NUMA_BIND: "yes"}),
        'annotation nvidia.com/numa-bind "yes": expected true or false '
        "(Go booleans: 1 t T TRUE true True, 0 f F FALSE false False)",
        422,
        "bad_annotation",
    ),
    (
        "unreadable scoring weights",
        make_pod(ctr(limits={GPU: "1", MEM: "1000"}), annotations={WEIGHTS: "slot=1,core=x,memory=1"}),
        'annotation hami.io/device-scoring-weights "slot=1,core=x,memory=1": "core" weight must be an '
        "integer; accepted: slot=<n>,core=<n>,memory=<n> in any order, non-negative integers, "
        "at least one positive",
        422,
        "bad_annotation",
    ),
    (
        "unknown node policy",
        make_pod(ctr(limits={GPU: "1"}), annotations={NODE_POLICY: "pack"}),
        'annotation hami.io/node-scheduler-policy "pack": unknown node policy; expected binpack, spread or '
        "fragmentation",
        422,
        "bad_annotation",
    ),
    (
        "unknown GPU policy in a list",
        make_pod(ctr(limits={GPU: "1"}), annotations={GPU_POLICY: "binpack, Numa ,topology"}),
        'annotation hami.io/gpu-scheduler-policy "binpack, Numa ,topology": unknown GPU policies '
        '"Numa", "topology"; expected binpack, spread, mutex, topology-aware or numa, '
        "or a comma list of them, or fragmentation alone",
        422,
        "bad_annotation",
    ),
    (
        "GPU policy naming no policy",
        make_pod(ctr(limits={GPU: "1"}), annotations={GPU_POLICY: " , "}),
        'annotation hami.io/gpu-scheduler-policy " , ": names no policy; expected binpack, spread, '
        "mutex, topology-aware or numa, or a comma list of them, or fragmentation alone",
        422,
        "bad_annotation",
    ),
    (
        "every bad annotation listed, after the container problems",
        make_pod(
            ctr("app"),
            init=(ctr("warm", limits={CORES: "-5"}),),
            annotations={NUMA_BIND: "on", GPU_POLICY: "pack", WEIGHTS: "slot=1"},
        ),
        'container "warm": nvidia.com/gpucores "-5" must not be negative; '
        'annotation nvidia.com/numa-bind "on": expected true or false '
        "(Go booleans: 1 t T TRUE true True, 0 f F FALSE false False); "
        'annotation hami.io/gpu-scheduler-policy "pack": unknown GPU policy "pack"; expected binpack, '
        "spread, mutex, topology-aware or numa, or a comma list of them, or fragmentation alone; "
        'annotation hami.io/device-scoring-weights "slot=1": expected slot, core, and memory weights; '
        "accepted: slot=<n>,core=<n>,memory=<n> in any order, non-negative integers, at least one positive",
        422,
        "bad_gpucores",
    ),
    # CUDA_DISABLE_CONTROL true (Go ParseBool) on a shared card: HAMi-core's limits would not be loaded
    (
        "isolation disabled on a memory slice",
        make_pod(ctr("train", limits={GPU: "1", MEM: "3000"}, env=disable_control("true"))),
        unisolated("train", "true"),
        403,
        "isolation_disabled",
    ),
    (
        "isolation disabled with all cores but part of the memory",
        make_pod(ctr("train", limits={GPU: "2", CORES: "100", MEM: "3000"}, env=disable_control("1"))),
        unisolated("train", "1"),
        403,
        "isolation_disabled",
    ),
    (
        "isolation disabled with all memory but part of the cores",
        make_pod(ctr("train", limits={GPU: "1", PCT: "100", CORES: "30"}, env=disable_control("T"))),
        unisolated("train", "T"),
        403,
        "isolation_disabled",
    ),
    (
        "isolation disabled by a later env entry",
        make_pod(
            ctr(
                "train",
                limits={GPU: "1", PCT: "50"},
                env=[*disable_control("false"), {"name": "A", "value": "1"}, *disable_control("True")],
            )
        ),
        unisolated("train", "True"),
        403,
        "isolation_disabled",
    ),
    (
        "isolation disabled in every shared container, init first",
        make_pod(
            ctr("app", limits={CORES: "20"}, env=disable_control("TRUE")),
            ctr("whole", limits={GPU: "1"}, env=disable_control("t")),
            init=(ctr("warm", limits={MEM: "1000"}, env=disable_control("t")),),
        ),
        unisolated("warm", "t") + "; " + unisolated("app", "TRUE"),
        403,
        "isolation_disabled",
    ),
    (
        "forged allocation label",
        make_pod(ctr(limits={GPU: "1"}), labels={"hami.io/vgpu-node": "gpu-1"}),
        "label hami.io/vgpu-node is written by HAMi only; a new pod may not carry it",
        403,
        "forged_label",
    ),
    # NVIDIA_VISIBLE_DEVICES: the container runtime's device list; only the node agent may set it
    (
        "visible devices in a shared GPU container",
        make_pod(ctr("train", limits={GPU: "1", MEM: "3000"}, env=visible_devices("all"))),
        visible_in_gpu_container("train"),
        403,
        "visible_devices",
    ),
    (
        "visible devices in a whole-card container",
        make_pod(ctr("train", limits={GPU: "1"}, env=visible_devices("GPU-0"))),
        visible_in_gpu_container("train"),
        403,
        "visible_devices",
    ),
    (
        "visible devices none in a GPU container",
        make_pod(ctr("train", limits={GPU: "1", CORES: "20"}, env=visible_devices("none"))),
        visible_in_gpu_container("train"),
        403,
        "visible_devices",
    ),
    (
        "visible devices from a config map in a GPU init container",
        make_pod(
            ctr("app"),
            init=(
                ctr(
                    "warm",
                    limits={MEM: "1000"},
                    env=visible_devices(valueFrom={"configMapKeyRef": {"name": "c", "key": "k"}}),
                ),
            ),
        ),
        visible_in_gpu_container("warm"),
        403,
        "visible_devices",
    ),
    (
        "visible devices all in a sidecar of a GPU pod",
        make_pod(ctr("train", limits={GPU: "1", MEM: "3000"}), ctr("side", env=visible_devices("all"))),
        visible_without_gpu("side", '="all"'),
        403,
        "visible_devices",
    ),
    (
        "visible devices in a pod asking for no card",
        make_pod(ctr("side", limits={"cpu": "1"}, env=visible_devices("0,1"))),
        visible_without_gpu("side", '="0,1"'),
        403,
        "visible_devices",
    ),
    (
        "visible devices from a field in a pod asking for no card",
        make_pod(ctr("side", env=visible_devices(valueFrom={"fieldRef": {"fieldPath": "metadata.name"}}))),
        visible_without_gpu("side", " (from valueFrom, which cannot be checked)"),
        403,
        "visible_devices",
    ),
    # the protective refusals apply to every GPU pod the webhook sees, whatever scheduler it names
    (
        "isolation disabled in a pod naming another scheduler",
        make_pod(
            ctr("train", limits={GPU: "1", MEM: "3000"}, env=disable_control("1")), schedulerName="volcano"
        ),
        unisolated("train", "1"),
        403,
        "isolation_disabled",
    ),
    (
        "visible devices in a pod naming another scheduler",
        make_pod(ctr("train", limits={GPU: "1"}, env=visible_devices("all")), schedulerName="volcano"),
        visible_in_gpu_container("train"),
        403,
        "visible_devices",
    ),
    (
        "isolation disabled in an ignored pod naming our scheduler",
        make_pod(
            ctr("train", limits={GPU: "1", PCT: "10"}, env=disable_control("true")),
            labels={"hami.io/webhook": "ignore"},
            schedulerName="hami-scheduler",
        ),
        unisolated("train", "true"),
        403,
        "isolation_disabled",
    ),
    (
        "isolation disabled and visible devices, both named",
        make_pod(
            ctr("a", limits={GPU: "1", MEM: "10"}, env=[*disable_control("1"), *visible_devices("all")]),
            schedulerName="volcano",
        ),
        unisolated("a", "1") + "; " + visible_in_gpu_container("a"),
        403,
        "isolation_disabled",
    ),
    # typos (webhook/typos.py): they would otherwise do nothing, silently
    (
        "look-alike resource next to a card",
        make_pod(ctr("train", limits={GPU: "1", "nvidia.com/gpumemory": "4000"})),
        'container "train": unknown resource nvidia.com/gpumemory; did you mean nvidia.com/gpumem?',
        422,
        "unknown_resource",
    ),
    (
        "look-alike resource alone",
        make_pod(ctr("train", limits={"nvidia.com/gpumem-percent": "50"})),
        'container "train": unknown resource nvidia.com/gpumem-percent; '
        "did you mean nvidia.com/gpumem-percentage?",
        422,
        "unknown_resource",
    ),
    (
        "look-alike annotation key",
        make_pod(ctr("train", limits={GPU: "1"}), annotations={"nvidia.com/use-gpu-type": "A100"}),
        "annotation nvidia.com/use-gpu-type is not one HAMi reads; did you mean nvidia.com/use-gputype?",
        422,
        "unknown_annotation",
    ),
    (
        "zero cards with memory",
        make_pod(ctr("train", limits={GPU: "0", MEM: "1000"})),
        'container "train": nvidia.com/gpu "0" with nvidia.com/gpumem "1000" asks for a share of no card; '
        "ask for 1 or more cards, or remove nvidia.com/gpumem",
        422,
        "zero_cards",
    ),
    # what MPS cannot express (webhook/mps.py)
    (
        "GPU containers of two users on MPS",
        make_pod(
            ctr("a", limits={GPU: "1", MEM: "1000"}),
            ctr("b", limits={GPU: "1", MEM: "1000"}, securityContext={"runAsUser": 1001}),
            annotations={"nvidia.com/vgpu-mode": "mps"},
            securityContext={"runAsUser": 1000},
        ),
        'container "b": securityContext.runAsUser 1001 differs from container "a"\'s user 1000, and both use '
        "an MPS card at the same time (nvidia.com/vgpu-mode: mps); one MPS server serves one user at a time, "
        "so one would wait for the other to finish; run the pod's GPU containers as one user",
        422,
        "mps_mixed_users",
    ),
]
