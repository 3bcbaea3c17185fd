"""SIMULATION ONLY: a kubelet stand-in for the embedded cluster of ``hami demo`` and the e2e tests.

There is no kubelet in the embedded cluster, so this process plays the part of the device manager
of one or more nodes, as far as the device plugin can see it:

* serves kubelet's ``Registration`` gRPC service on ``<kubelet-dir>/kubelet.sock`` and, when a plugin
  registers, dials ``<kubelet-dir>/<endpoint>``, follows ``ListAndWatch`` and publishes the healthy
  device count as the node's ``status.capacity/allocatable[<resource>]``;
* for every pod bound to its node (``spec.nodeName``) that is still ``Pending``, admits it as kubelet
  does: for each container (init containers first) asking for a plugin's resource, picks that many
  free replica IDs (asking ``GetPreferredAllocation`` when the plugin offers it), calls ``Allocate``
  with them (and ``PreStartContainer`` when required), then patches ``status.phase=Running``; an
  ``Allocate`` error fails the pod with ``UnexpectedAdmissionError`` as kubelet does;
* keeps what it handed out in ``<kubelet-dir>/kubelet_internal_checkpoint`` (JSON, readable: pod,
  container, resource, device IDs and the plugin's answer) and frees the IDs when the pod goes away
  or finishes (Succeeded or Failed), as kubelet's device manager does.

Run: ``python -m hami_testkit.kubelet_standin --kubeconfig FILE --node NAME=KUBELET_DIR [--node ...]``.
Talks to the API server through ``hami.kube`` and to the plugin through the generated stubs in
``hami.kubeletapi``. Must not be imported by the agent: nothing but the demo starts it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import logging
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from hami import objects
from hami.kube.client import KubeError, NotFound, call_json, core_api, load_api_client
from hami.kube.protocol import KubeApi
from hami.kube.watch import ListWatcher
from hami.kubeletapi import api_pb2, api_pb2_grpc

logger = logging.getLogger("kubelet-standin")
MERGE_PATCH = "application/merge-patch+json"
CHECKPOINT = "kubelet_internal_checkpoint"
RPC_TIMEOUT = 15.0


@dataclass
class Plugin:
    """One registered device plugin (one resource name) as kubelet's device manager tracks it."""

    resource: str
    endpoint: str
    options: Any  # api_pb2.DevicePluginOptions
    channel: Any  # grpc.aio.Channel
    stub: Any  # api_pb2_grpc.DevicePluginStub
    devices: dict[str, bool] = field(default_factory=dict)  # replica ID -> healthy, in plugin order
    task: asyncio.Task[None] | None = None


@dataclass
class Assigned:
    """What one admitted pod holds: replica IDs per (container, resource) and the plugin answers."""

    uid: str
    entries: list[dict[str, Any]] = field(default_factory=list)

    def ids(self) -> set[str]:
        return {i for entry in self.entries for i in entry["deviceIDs"]}


class NodeKubelet:
    """The device-manager half of one node's kubelet (see the module docstring)."""

    def __init__(self, api: KubeApi, node: str, kubelet_dir: Path, *, plugin_wait: float) -> None:
        self.api = api
        self.node = node
        self.dir = kubelet_dir
        self.plugin_wait = plugin_wait
        self.plugins: dict[str, Plugin] = {}
        self.assigned: dict[tuple[str, str], Assigned] = {}
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.queued: set[tuple[str, str, str]] = set()
        self.plugin_changed = asyncio.Event()
        self.server: Any = None
        self.worker: asyncio.Task[None] | None = None

    # ----------------------------------------------------------------------------- registration

    async def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        socket_path = self.dir / "kubelet.sock"
        socket_path.unlink(missing_ok=True)
        self.server = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(_Registration(self), self.server)
        self.server.add_insecure_port(f"unix://{socket_path}")
        await self.server.start()
        self.worker = asyncio.create_task(self._admit_loop(), name=f"admit-{self.node}")
        logger.info("%s: kubelet.sock serving at %s", self.node, socket_path)

    async def stop(self) -> None:
        if self.worker is not None:
            self.worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.worker
        for plugin in self.plugins.values():
            await self._close(plugin)
        if self.server is not None:
            await self.server.stop(grace=1.0)
        (self.dir / "kubelet.sock").unlink(missing_ok=True)

    async def register(self, request: Any) -> None:
        if request.version != "v1beta1":
            raise ValueError(f"unsupported device-plugin API version {request.version!r} (want v1beta1)")
        old = self.plugins.pop(request.resource_name, None)
        if old is not None:
            await self._close(old)
        channel = grpc.aio.insecure_channel(f"unix://{self.dir / request.endpoint}")
        plugin = Plugin(
            resource=request.resource_name,
            endpoint=request.endpoint,
            options=request.options,
            channel=channel,
            stub=api_pb2_grpc.DevicePluginStub(channel),
        )
        self.plugins[plugin.resource] = plugin
        plugin.task = asyncio.create_task(self._follow(plugin), name=f"listandwatch-{self.node}")
        logger.info("%s: plugin %s registered at %s", self.node, plugin.resource, plugin.endpoint)

    async def _close(self, plugin: Plugin) -> None:
        if plugin.task is not None:
            plugin.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await plugin.task
        await plugin.channel.close()

    async def _follow(self, plugin: Plugin) -> None:
        """Follow ListAndWatch; publish capacity on every update; forget the devices when it ends."""
        try:
            async for update in plugin.stub.ListAndWatch(api_pb2.Empty()):
                plugin.devices = {d.ID: d.health.lower() == "healthy" for d in update.devices}
                await self._publish(plugin)
                self.plugin_changed.set()
        except grpc.aio.AioRpcError as exc:
            logger.warning("%s: ListAndWatch of %s ended: %s", self.node, plugin.resource, exc.details())
        plugin.devices = {}
        with contextlib.suppress(KubeError):
            await self._publish(plugin)

    async def _publish(self, plugin: Plugin) -> None:
        healthy = sum(plugin.devices.values())
        body = {
            "status": {
                "capacity": {plugin.resource: str(len(plugin.devices))},
                "allocatable": {plugin.resource: str(healthy)},
            }
        }
        await call_json(
            self.api, core_api(self.api).patch_node_status, self.node, body, _content_type=MERGE_PATCH
        )

    # ---------------------------------------------------------------------------------- pods

    def observe(self, kind: str, pod: dict[str, Any]) -> None:
        """A pod event for this node (called on the loop by the shared watcher)."""
        key, uid = (objects.namespace(pod), objects.name(pod)), objects.uid(pod)
        if kind == "DELETED" or objects.meta(pod).get("deletionTimestamp"):
            self.release(key)
            return
        held = self.assigned.get(key)
        if held is not None and held.uid != uid:
            self.release(key)  # same name, new pod: the old one is gone
        phase = (pod.get("status") or {}).get("phase") or "Pending"
        if phase in objects.FINISHED_PHASES:  # a finished pod's devices are free again (device manager)
            self.release(key)
            return
        if phase != "Pending" or key in self.assigned or (*key, uid) in self.queued:
            return
        self.queued.add((*key, uid))
        self.queue.put_nowait(pod)

    def release(self, key: tuple[str, str]) -> None:
        if self.assigned.pop(key, None) is not None:
            self._write_checkpoint()

    async def _admit_loop(self) -> None:
        while True:  # kubelet admits one pod at a time; so does HAMi's Allocate (a node-wide mutex)
            pod = await self.queue.get()
            meta = pod["metadata"]
            key = (meta.get("namespace") or "", meta["name"])
            try:
                await self.admit(pod)
            except Exception:
                logger.exception("%s: admitting %s/%s failed unexpectedly", self.node, *key)
            finally:
                self.queued.discard((*key, str(meta.get("uid") or "")))

    async def admit(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        key = (str(meta.get("namespace") or ""), str(meta["name"]))
        spec = pod.get("spec") or {}
        held = Assigned(uid=str(meta.get("uid") or ""))
        self.assigned[key] = held
        containers = [(c, True) for c in spec.get("initContainers") or []]
        containers += [(c, False) for c in spec.get("containers") or []]
        try:
            for container, _ in containers:
                for resource, count in _device_requests(container).items():
                    if resource not in self.plugins:
                        continue  # not a device-plugin resource (e.g. nvidia.com/gpumem): kubelet ignores it
                    entry = await self._allocate(key, container["name"], resource, count, held)
                    held.entries.append(entry)
        except _AdmissionError as exc:
            self.release(key)
            logger.warning("%s: %s/%s: %s", self.node, *key, exc)
            await self._set_status(key, _failed_status(str(exc)))
            return
        self._write_checkpoint()
        logger.info("%s: %s/%s admitted (%d allocations)", self.node, *key, len(held.entries))
        await self._set_status(key, _running_status(pod, [c for c, init in containers if init]))

    async def _allocate(
        self, key: tuple[str, str], container: str, resource: str, count: int, held: Assigned
    ) -> dict[str, Any]:
        plugin = await self._plugin_for(resource)
        in_use = {i for other in self.assigned.values() for i in other.ids()} | held.ids()
        free = [i for i, healthy in plugin.devices.items() if healthy and i not in in_use]
        if len(free) < count:
            raise _AdmissionError(
                f"Allocate failed due to requested number of devices unavailable for {resource}. "
                f"Requested: {count}, Available: {len(free)}, which is unexpected"
            )
        chosen = free[:count]
        try:
            if plugin.options.get_preferred_allocation_available:
                chosen = await self._preferred(plugin, free, count) or chosen
            request = api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=chosen)]
            )
            answer = await plugin.stub.Allocate(request, timeout=RPC_TIMEOUT)
            if plugin.options.pre_start_required:
                await plugin.stub.PreStartContainer(
                    api_pb2.PreStartContainerRequest(devices_ids=chosen), timeout=RPC_TIMEOUT
                )
        except grpc.aio.AioRpcError as exc:
            raise _AdmissionError(
                f"Allocate failed due to rpc error: code = {exc.code().name} desc = {exc.details()}, "
                "which is unexpected"
            ) from exc
        response = (
            answer.container_responses[0]
            if answer.container_responses
            else api_pb2.ContainerAllocateResponse()
        )
        return {
            "podUID": held.uid,
            "namespace": key[0],
            "pod": key[1],
            "containerName": container,
            "resourceName": resource,
            "deviceIDs": list(chosen),
            "envs": dict(response.envs),
            "annotations": dict(response.annotations),
            "mounts": [
                {"containerPath": m.container_path, "hostPath": m.host_path, "readOnly": m.read_only}
                for m in response.mounts
            ],
            "devices": [
                {"containerPath": d.container_path, "hostPath": d.host_path} for d in response.devices
            ],
        }

    async def _preferred(self, plugin: Plugin, free: list[str], count: int) -> list[str] | None:
        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=free, allocation_size=count)
            ]
        )
        answer = await plugin.stub.GetPreferredAllocation(request, timeout=RPC_TIMEOUT)
        ids = list(answer.container_responses[0].deviceIDs) if answer.container_responses else []
        # kubelet ignores a preference that is not a valid pick
        return ids if len(ids) == count and set(ids) <= set(free) else None

    async def _plugin_for(self, resource: str) -> Plugin:
        """The registered plugin with devices for ``resource``; waits (bounded) for it to (re)appear."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.plugin_wait
        while True:
            plugin = self.plugins.get(resource)
            if plugin is not None and plugin.devices:
                return plugin
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise _AdmissionError(f"no device plugin serves {resource} on node {self.node}")
            self.plugin_changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.plugin_changed.wait(), remaining)

    async def _set_status(self, key: tuple[str, str], status: dict[str, Any]) -> None:
        patch = core_api(self.api).patch_namespaced_pod_status
        try:
            await call_json(self.api, patch, key[1], key[0], {"status": status}, _content_type=MERGE_PATCH)
        except NotFound:
            self.release(key)

    def _write_checkpoint(self) -> None:
        entries = [entry for held in self.assigned.values() for entry in held.entries]
        registered = {p.resource: list(p.devices) for p in self.plugins.values()}
        document = {"Data": {"PodDeviceEntries": entries, "RegisteredDevices": registered}}
        tmp = self.dir / f".{CHECKPOINT}.tmp"
        tmp.write_text(json.dumps(document, indent=1, sort_keys=True), encoding="utf-8")
        tmp.replace(self.dir / CHECKPOINT)


class _AdmissionError(Exception):
    """The pod cannot be admitted on this node; the text is kubelet's status message."""


class _Registration(api_pb2_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, kubelet: NodeKubelet) -> None:
        self._kubelet = kubelet

    async def Register(self, request: Any, context: Any) -> Any:  # the gRPC method name
        try:
            await self._kubelet.register(request)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return api_pb2.Empty()


def _device_requests(container: Mapping[str, Any]) -> dict[str, int]:
    """Extended resources (``vendor/name`` with an integer count > 0) a container asks for; only those a
    device plugin registered are allocated (kubelet treats the others as plain node resources)."""
    resources = container.get("resources") or {}
    merged = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
    wanted: dict[str, int] = {}
    for name, value in merged.items():
        if "/" not in name or name.startswith(("kubernetes.io/", "hugepages-")):
            continue
        try:
            count = int(str(value))
        except ValueError:
            continue
        if count > 0:
            wanted[name] = count
    return wanted


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _running_status(pod: Mapping[str, Any], init: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    now = _now()
    containers = (pod.get("spec") or {}).get("containers") or []
    return {
        "phase": "Running",
        "hostIP": "127.0.0.1",
        "startTime": now,
        "conditions": [
            {"type": kind, "status": "True", "lastTransitionTime": now}
            for kind in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
        ],
        "initContainerStatuses": [
            {
                "name": c["name"],
                "ready": True,
                "restartCount": 0,
                "image": c.get("image", ""),
                "state": {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": now}},
            }
            for c in init
        ],
        "containerStatuses": [
            {
                "name": c["name"],
                "ready": True,
                "started": True,
                "restartCount": 0,
                "image": c.get("image", ""),
                "state": {"running": {"startedAt": now}},
            }
            for c in containers
        ],
    }


def _failed_status(message: str) -> dict[str, Any]:
    return {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": message}


# ------------------------------------------------------------------------------------------ process


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m hami_testkit.kubelet_standin", description="SIMULATION: kubelet's device manager."
    )
    parser.add_argument("--kubeconfig", required=True, help="kubeconfig of the (embedded) API server")
    parser.add_argument(
        "--node", action="append", required=True, metavar="NAME=KUBELET_DIR", help="a node to stand in for"
    )
    parser.add_argument("--plugin-wait", type=float, default=10.0, help="seconds a pod waits for a plugin")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    for value in args.node:
        if "=" not in value or not value.split("=", 1)[0] or not value.split("=", 1)[1]:
            parser.error(f"--node must be NAME=KUBELET_DIR, got {value!r}")
    return args


async def serve(args: argparse.Namespace) -> None:
    api = load_api_client(args.kubeconfig, component="kubelet-standin")
    kubelets: dict[str, NodeKubelet] = {}
    for value in args.node:
        name, directory = value.split("=", 1)
        kubelets[name] = NodeKubelet(api, name, Path(directory), plugin_wait=args.plugin_wait)
    for kubelet in kubelets.values():
        await kubelet.start()

    def dispatch(kind: str, pod: dict[str, Any]) -> None:
        target = kubelets.get(str((pod.get("spec") or {}).get("nodeName") or ""))
        if target is not None:
            target.observe(kind, pod)

    def resync(pods: list[dict[str, Any]]) -> None:
        """A pod list is complete (each pod already came through ``dispatch``): free the pods gone."""
        present = {(p["metadata"].get("namespace") or "", p["metadata"]["name"]) for p in pods}
        for kubelet in kubelets.values():
            for key in [k for k in kubelet.assigned if k not in present]:
                kubelet.release(key)

    loop = asyncio.get_running_loop()
    watcher = ListWatcher(api, "pods", loop=loop, on_list=resync, on_event=dispatch)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watcher.start()
    try:
        await stop.wait()
    finally:
        await asyncio.to_thread(watcher.stop)
        for kubelet in kubelets.values():
            await kubelet.stop()
        logger.info("stopped")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=str(args.log_level).upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
