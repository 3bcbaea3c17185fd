"""Every annotation and label key of the HAMi protocol (docs/annotations.md, "Node annotations";
docs/protocol.md, "Extender", "Node lock", "Steering").

Owns the key strings only; formats live beside them in the codec package. Pure: stdlib only.
"""

from __future__ import annotations

# ----------------------------------------------------------------------------------- node annotations
NODE_REGISTER = "hami.io/node-nvidia-register"
NODE_PAIR_SCORES = "hami.io/node-nvidia-score"
NODE_HANDSHAKE = "hami.io/node-handshake"
NODE_LOCK = "hami.io/mutex.lock"
NODE_DEVICE_CORDON = "hami.io/device-cordon"
#: ours, not HAMi's: which enforcement the node agent found per card (``enforcement``)
NODE_ENFORCEMENT = "hami.io/node-enforcement"

# ------------------------------------------------------------------------------------ pod annotations
# written by the scheduler / node agent
POD_VGPU_NODE = "hami.io/vgpu-node"  # also a label with the same key
POD_VGPU_TIME = "hami.io/vgpu-time"
POD_DEVICES_TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
POD_DEVICES_ALLOCATED = "hami.io/vgpu-devices-allocated"
POD_MIG_ALLOCATIONS = "hami.io/vgpu-mig-allocations"
POD_BIND_PHASE = "hami.io/bind-phase"
POD_BIND_TIME = "hami.io/bind-time"
#: ours, not HAMi's: the enforcement of each granted card at bind (``enforcement``)
POD_VGPU_ENFORCEMENT = "hami.io/vgpu-enforcement"
#: ours, not HAMi's: touched by the scheduler to make kube-scheduler retry a parked pod (``wakeup``)
POD_WAKE_UP = "hami.io/wake-up"
# written by users
POD_USE_GPUTYPE = "nvidia.com/use-gputype"
POD_NOUSE_GPUTYPE = "nvidia.com/nouse-gputype"
POD_USE_GPUUUID = "nvidia.com/use-gpuuuid"
POD_NOUSE_GPUUUID = "nvidia.com/nouse-gpuuuid"
POD_NUMA_BIND = "nvidia.com/numa-bind"
POD_VGPU_MODE = "nvidia.com/vgpu-mode"
POD_NODE_POLICY = "hami.io/node-scheduler-policy"
POD_GPU_POLICY = "hami.io/gpu-scheduler-policy"
POD_SCORING_WEIGHTS = "hami.io/device-scoring-weights"
#: ours, not HAMi's: the least enforcement the pod's cards must have (``enforcement``)
POD_REQUIRE_ENFORCEMENT = "hami.io/require-enforcement"

# labels
WEBHOOK_IGNORE_LABEL = "hami.io/webhook"  # value "ignore" excludes a pod or namespace
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"

#: The steering annotations users set on pods (docs/protocol.md, "Steering"; docs/annotations.md).
USER_POD_ANNOTATIONS: tuple[str, ...] = (
    POD_USE_GPUTYPE,
    POD_NOUSE_GPUTYPE,
    POD_USE_GPUUUID,
    POD_NOUSE_GPUUUID,
    POD_NUMA_BIND,
    POD_VGPU_MODE,
    POD_NODE_POLICY,
    POD_GPU_POLICY,
    POD_SCORING_WEIGHTS,
    POD_REQUIRE_ENFORCEMENT,
)

#: Annotations only our components may write; a new pod carrying one is refused by the webhook.
INTERNAL_POD_ANNOTATIONS: tuple[str, ...] = (
    POD_VGPU_NODE,
    POD_VGPU_TIME,
    POD_DEVICES_TO_ALLOCATE,
    POD_DEVICES_ALLOCATED,
    POD_MIG_ALLOCATIONS,
    POD_BIND_PHASE,
    POD_BIND_TIME,
    NODE_LOCK,
    POD_VGPU_ENFORCEMENT,
    POD_WAKE_UP,
)
