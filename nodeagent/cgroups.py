"""Which pod and container a host process belongs to, from its cgroup (``/proc/<pid>/cgroup``).

Owns the parsing of kubelet's cgroup paths, for both cgroup drivers and both cgroup versions::

    0::/kubepods/burstable/pod8c6f1c3e-0d0a-4c8e-9a55-2b0f4f1e6a71/<64-hex container id>
    0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod8c6f1c3e_0d0a_..._6a71.slice/
        cri-containerd-<64-hex container id>.scope          (systemd driver: "_" in the UID)
    11:memory:/kubepods/pod<uid>/docker-<id>.scope          (cgroup v1; docker-, crio-, cri-containerd-)

The result is ``(pod UID, container ID)``; the container ID is matched against the pod's
``status.containerStatuses[].containerID``. PIDs come from the driver, so they are host PIDs: the
agent needs the host's ``/proc`` (``hostPID: true``). Must not import grpc, pynvml or the Kubernetes
client.
"""

from __future__ import annotations

import re
from pathlib import Path

#: ``pod<UUID>`` (dashes, or underscores under the systemd driver) or a static pod's 32-hex hash.
_POD = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32})(?:\.slice)?/"
)
#: The container's own cgroup: the last path segment, a 64-hex ID with an optional runtime prefix.
_CONTAINER = re.compile(r"/(?:[a-z-]+-)?([0-9a-f]{64})(?:\.scope)?$")


def owner_of_cgroup(text: str) -> tuple[str, str] | None:
    """``(pod UID, container ID)`` from the content of a ``/proc/<pid>/cgroup`` file; None when the
    process is not in a pod container (a host process, a pause container's parent, ...)."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1].strip().rstrip("/")
        pod = _POD.search(path)
        container = _CONTAINER.search(path)
        if pod and container and container.start() >= pod.end() - 1:
            return pod.group(1).replace("_", "-"), container.group(1)
    return None


class ProcessOwners:
    """Resolve PIDs through ``<proc_root>/<pid>/cgroup`` (``/proc`` on a node; a directory in tests)."""

    def __init__(self, proc_root: Path = Path("/proc")) -> None:
        self._root = proc_root

    def owner(self, pid: int) -> tuple[str, str] | None:
        """The pod UID and container ID of ``pid``; None when unknown or the process is gone."""
        try:
            text = (self._root / str(pid) / "cgroup").read_text()
        except OSError:
            return None  # exited between the driver's list and now, or no access
        return owner_of_cgroup(text)
