"""Serve the device plugin on its socket and keep it registered with kubelet, forever.

Owns the plugin lifecycle (docs/node-agent.md, "Device plugin"): remove a stale socket, serve
``<kubelet-dir>/nvidia-<resource>.sock`` (gRPC over a unix socket), call kubelet's
``Registration.Register`` on ``<kubelet-dir>/kubelet.sock``, then watch both sockets. A restarted kubelet
recreates its socket and wipes the plugin sockets: either change stops the server and starts the whole
cycle again. While kubelet's socket is absent or Register fails the runner retries every ``retry``
seconds; it never exits. Must not import pynvml or the Kubernetes client.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import grpc

from hami.kubeletapi import api_pb2, api_pb2_grpc
from nodeagent.deviceplugin.server import DevicePluginService

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"


def socket_name(resource_name: str) -> str:
    """``nvidia.com/gpu`` → ``nvidia-gpu.sock`` (HAMi's naming)."""
    return f"nvidia-{resource_name.rsplit('/', 1)[-1]}.sock"


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_ino, stat.st_ctime_ns


class _SocketGone(Exception):
    """Our own socket vanished (kubelet wiped the plugin directory): serve again, then register."""


class KubeletRunner:
    """Serve ``service`` and register it as ``resource_name``; ``run`` returns only when cancelled."""

    def __init__(
        self,
        *,
        service: DevicePluginService,
        kubelet_dir: Path,
        resource_name: str,
        preferred_allocation: bool = False,
        retry: float = 5.0,
        watch_interval: float = 1.0,
        node_name: str = "",
    ) -> None:
        self._service, self._dir, self._resource = service, kubelet_dir, resource_name
        self._preferred, self._retry, self._watch = preferred_allocation, retry, watch_interval
        self._node = node_name
        self.registrations = 0  # how many times kubelet accepted us (observability and tests)
        self.registered = asyncio.Event()
        self.serving = asyncio.Event()  # set while our socket is being served

    @property
    def socket_path(self) -> Path:
        return self._dir / socket_name(self._resource)

    async def run(self) -> None:
        while True:
            server = await self._serve()
            self.serving.set()
            try:
                kubelet = await self._register_until_accepted()
                await self._wait_for_restart(kubelet)
            except _SocketGone:
                log.info(
                    "device plugin socket %s disappeared before registering: serving again", self.socket_path
                )
            finally:
                self.registered.clear()
                self.serving.clear()
                await server.stop(grace=1.0)
                self.socket_path.unlink(missing_ok=True)

    async def _serve(self) -> grpc.aio.Server:
        while True:
            try:
                self._dir.mkdir(parents=True, exist_ok=True)
                self.socket_path.unlink(missing_ok=True)
                server = grpc.aio.server()
                api_pb2_grpc.add_DevicePluginServicer_to_server(self._service, server)
                server.add_insecure_port(f"unix://{self.socket_path}")
                await server.start()
                return server
            except (OSError, RuntimeError) as exc:
                log.error(
                    "cannot serve the device plugin on %s, retrying in %gs: %s",
                    self.socket_path,
                    self._retry,
                    exc,
                )
                await asyncio.sleep(self._retry)

    async def _register_until_accepted(self) -> tuple[int, int]:
        """Register with kubelet; returns the identity of the kubelet socket that accepted us."""
        kubelet_socket = self._dir / KUBELET_SOCKET
        waiting_logged = False
        while True:
            identity = _identity(kubelet_socket)
            if identity is None:
                if not waiting_logged:
                    log.warning("kubelet socket %s is absent; waiting for kubelet", kubelet_socket)
                    waiting_logged = True
                await asyncio.sleep(self._retry)
                continue
            if _identity(self.socket_path) is None:
                # a starting kubelet wipes plugin sockets: never register an endpoint that is gone
                raise _SocketGone
            try:
                await self._register(kubelet_socket)
            except grpc.aio.AioRpcError as exc:
                log.warning("kubelet refused registration, retrying in %gs: %s", self._retry, exc.details())
                await asyncio.sleep(self._retry)
                continue
            self.registrations += 1
            self.registered.set()
            log.info(
                "registered device plugin %s for %s with kubelet on node %s",
                self.socket_path.name,
                self._resource,
                self._node or os.environ.get("NODE_NAME", "?"),
            )
            return identity

    async def _register(self, kubelet_socket: Path) -> None:
        async with grpc.aio.insecure_channel(f"unix://{kubelet_socket}") as channel:
            stub = api_pb2_grpc.RegistrationStub(channel)
            await stub.Register(
                api_pb2.RegisterRequest(
                    version=API_VERSION,
                    endpoint=self.socket_path.name,
                    resource_name=self._resource,
                    options=api_pb2.DevicePluginOptions(get_preferred_allocation_available=self._preferred),
                ),
                timeout=10,
            )

    async def _wait_for_restart(self, kubelet: tuple[int, int]) -> None:
        """Return when kubelet's socket was replaced or removed, or our own socket vanished."""
        own = _identity(self.socket_path)
        if own is None:
            raise _SocketGone
        while True:
            await asyncio.sleep(self._watch)
            now_kubelet = _identity(self._dir / KUBELET_SOCKET)
            if now_kubelet != kubelet:
                log.info("kubelet socket changed (kubelet restarted?): serving and registering again")
                return
            if _identity(self.socket_path) != own:
                log.info(
                    "device plugin socket %s disappeared: serving and registering again", self.socket_path
                )
                return
