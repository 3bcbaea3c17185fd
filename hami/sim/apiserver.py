"""The embedded API server: kmock's emulator plus the reactions a real apiserver has and kmock lacks.

Owns the three reactions documented in ``testing-here.md``: ``pods/binding`` (sets ``spec.nodeName``
through the emulator's own PATCH so watchers see it), the core discovery fix (``/api/v1`` must say
``groupVersion: v1`` for kubectl), and ``kind``/``apiVersion`` on list responses. Used by the test suite
and by ``hami demo``. Simulation only: nothing in production imports this module.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import kmock


async def add_reactions(k: kmock.KubernetesEmulator) -> None:
    """Load the bundled discovery data and install the binding, discovery and list-kind reactions."""
    k.resources.load_bundled()

    async def bind(request: kmock.Request) -> Any:
        target = request.data["target"]["name"]
        path = f"/api/v1/namespaces/{request.namespace}/pods/{request.name}"
        response = await k.patch(path, json={"spec": {"nodeName": target}})
        if response.status != 200:  # e.g. the pod is gone: answer with the patch's own status
            return kmock.Response(status=response.status, payload=await response.json())  # type: ignore[attr-defined]
        return {"apiVersion": "v1", "kind": "Status", "status": "Success", "code": 201}

    k["post", kmock.resource("v1/pods"), kmock.subresource("binding")] << bind

    response = await k.get("/api/v1")
    core = await response.json()
    core["groupVersion"] = "v1"
    k["get /api/v1"] << core

    async def listing(request: kmock.Request) -> Any:
        assert request.resource is not None  # guaranteed by is_listing
        items = [
            obj.raw
            for (resource, namespace, _), obj in list(k.objects.items())
            if resource == request.resource
            and not obj.deleted
            and (request.namespace is None or namespace == request.namespace)
        ]
        group = request.resource.group
        group_version = "v1" if group == "" else f"{group}/{request.resource.version}"
        kind = k.resources[request.resource].kind
        return {
            "apiVersion": group_version,
            "kind": f"{kind}List",
            "metadata": {"resourceVersion": ""},
            "items": items,
        }

    def is_listing(request: kmock.Request) -> bool:
        return bool(request.resource and request.resource.plural)

    k[kmock.action.LIST][is_listing] << listing


def write_kubeconfig(path: Path, server_url: str) -> Path:
    """Write a kubeconfig pointing at ``server_url`` with a dummy token (kubectl and clients accept it)."""
    path.write_text(
        "apiVersion: v1\n"
        "kind: Config\n"
        "clusters:\n"
        f"- name: embedded\n  cluster:\n    server: {server_url}\n"
        "users:\n- name: embedded\n  user:\n    token: embedded-cluster-token\n"
        "contexts:\n- name: embedded\n  context:\n    cluster: embedded\n    user: embedded\n"
        "current-context: embedded\n"
    )
    return path


@asynccontextmanager
async def embedded_apiserver(
    host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[kmock.KubernetesEmulator]:
    """Run an emulator with the reactions on ``host:port`` (0 = an OS-chosen port); yields it.

    The server's URL is ``str(emulator.url)`` once started.
    """
    async with kmock.KubernetesEmulator() as k, kmock.Server(k, host=host, port=port):
        await add_reactions(k)
        yield k
