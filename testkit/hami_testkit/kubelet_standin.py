"""SIMULATION ONLY: a kubelet stand-in for the embedded cluster of ``hami demo`` and the e2e tests.

There is no kubelet in the embedded cluster, so this process plays the part of the device manager
of one or more nodes, as far as the device plugin can see it:

* serves kubelet's ``Registration`` gRPC service on ``<kubelet-dir>/kubelet.sock`` and, when a plugin
  registers, dials ``<kubelet-dir>/<endpoint>``, follows ``ListAndWatch`` and publishes the healthy
  device count as the node's ``status.capacity/allocatable[<resource>]``;
* for every pod bound to its node (``spec.nodeName``) that is still ``Pending``, admits it as kubelet
  does, through the test kit's one kubelet model (:class:`hami_testkit.device_manager.DeviceManager`:
  replica IDs per container, ``GetPreferredAllocation``, ``Allocate``, ``PreStartContainer``, then
  ``status.phase=Running``, or ``UnexpectedAdmissionError``), calling the plugin over gRPC;
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
import json
import logging
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from hami import objects
from hami.kube import paths
from hami.kube.client import KubeError, NotFound, call_json, load_api_client
from hami.kube.protocol import KubeApi
from hami.kube.watch import ListWatcher
from hami.kubeletapi import api_pb2, api_pb2_grpc
from hami_testkit.device_manager import AdmissionError, Assigned, DeviceManager, PluginRefused

logger = logging.getLogger("kubelet-standin")
MERGE_PATCH = paths.MERGE_PATCH
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

    # the calls of :class:`hami_testkit.device_manager.PluginCalls`, over gRPC
    async def preferred(self, request: Any) -> Any:
        return await _rpc(self.stub.GetPreferredAllocation, request)

    async def allocate(self, request: Any) -> Any:
        return await _rpc(self.stub.Allocate, request)

    async def pre_start(self, request: Any) -> Any:
        return await _rpc(self.stub.PreStartContainer, request)


async def _rpc(method: Any, request: Any) -> Any:
    try:
        return await method(request, timeout=RPC_TIMEOUT)
    except grpc.aio.AioRpcError as exc:
        raise PluginRefused(exc.code().name, str(exc.details())) from exc


class NodeKubelet:
    """The device-manager half of one node's kubelet (see the module docstring)."""

    def __init__(self, api: KubeApi, node: str, kubelet_dir: Path, *, plugin_wait: float) -> None:
        self.api = api
        self.node = node
        self.dir = kubelet_dir
        self.plugin_wait = plugin_wait
        self.plugins: dict[str, Plugin] = {}
        self.manager = DeviceManager(node, lambda: self.plugins, self._plugin_for)
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
            self.api,
            "PATCH",
            paths.NODE_STATUS,
            params={"name": self.node},
            body=body,
            content_type=MERGE_PATCH,
        )

    @property
    def assigned(self) -> dict[tuple[str, str], Assigned]:
        """What each admitted pod holds (the device manager's)."""
        return self.manager.assigned

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
        if self.manager.release(key):
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
        key = (objects.namespace(pod), objects.name(pod))

        async def report(key: tuple[str, str], status: dict[str, Any]) -> None:
            self._write_checkpoint()  # what was handed out is on disk before the pod shows Running
            await self._set_status(key, status)

        done = await self.manager.admit(pod, report)
        if done.admitted:
            logger.info("%s: %s/%s admitted (%d allocations)", self.node, *key, len(done.entries))
        else:
            logger.warning("%s: %s/%s: %s", self.node, *key, done.message)

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
                raise AdmissionError(f"no device plugin serves {resource} on node {self.node}")
            self.plugin_changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.plugin_changed.wait(), remaining)

    async def _set_status(self, key: tuple[str, str], status: dict[str, Any]) -> None:
        where = {"namespace": key[0], "name": key[1]}
        try:
            await call_json(
                self.api,
                "PATCH",
                paths.POD_STATUS,
                params=where,
                body={"status": status},
                content_type=MERGE_PATCH,
            )
        except NotFound:
            self.release(key)

    def _write_checkpoint(self) -> None:
        entries = [entry for held in self.assigned.values() for entry in held.entries]
        registered = {p.resource: list(p.devices) for p in self.plugins.values()}
        document = {"Data": {"PodDeviceEntries": entries, "RegisteredDevices": registered}}
        tmp = self.dir / f".{CHECKPOINT}.tmp"
        tmp.write_text(json.dumps(document, indent=1, sort_keys=True), encoding="utf-8")
        tmp.replace(self.dir / CHECKPOINT)


class _Registration(api_pb2_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, kubelet: NodeKubelet) -> None:
        self._kubelet = kubelet

    async def Register(self, request: Any, context: Any) -> Any:  # the gRPC method name
        try:
            await self._kubelet.register(request)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return api_pb2.Empty()


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
