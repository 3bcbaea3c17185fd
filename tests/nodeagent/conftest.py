"""Fixtures for the node agent: a real API client on the embedded API server, a short temporary
directory for unix sockets (their paths are limited to ~107 bytes, which pytest's tmp_path can exceed),
node n1's Allocator (on its pod cache) and device plugin (``allocator``, ``stub``) over the cards of a
module's own ``inventory`` fixture, with its ``agent_settings`` (default settings unless the module
overrides them), and the host markers: a test marked ``gpu`` talks to this host's real NVML and runs only
where the NVIDIA driver's library loads; one marked ``no_gpu`` asserts its absence and runs only where it
does not."""

from __future__ import annotations

import ctypes
import functools
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from hami.kube.client import load_api_client
from nodeagent.allocate_call import Allocator
from nodeagent.config import NodeSettings
from nodeagent.inventory import Inventory
from nodeagent.podcache import PodCache

from .agent_helpers import make_allocator, plugin_stub


@functools.cache
def nvml_library_here() -> bool:
    """Whether this host has NVIDIA's NVML library (what pynvml loads on Linux)."""
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def pytest_runtest_setup(item: pytest.Item) -> None:
    here = nvml_library_here()
    if item.get_closest_marker("gpu") is not None and not here:
        pytest.skip("needs the NVIDIA driver's NVML library (libnvidia-ml.so.1) on this host")
    if item.get_closest_marker("no_gpu") is not None and here:
        pytest.skip("asserts a host without the NVIDIA driver; this one has libnvidia-ml.so.1")


@pytest.fixture
def api(kubeconfig: Path) -> Iterator[Any]:
    client = load_api_client(str(kubeconfig), request_timeout=5.0)
    yield client
    client.close()


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hm-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def agent_settings() -> NodeSettings:
    return NodeSettings()


@pytest.fixture
async def allocator(
    api: Any, inventory: Inventory, agent_settings: NodeSettings, tmp_path: Path
) -> AsyncIterator[Allocator]:
    """Node n1's Allocator reading the node's pods from its pod cache, as the agent wires it; the Events
    it still writes are drained and the cache's watch stopped at the end."""
    pods = PodCache(api, "n1")
    pods.start()
    allocator = make_allocator(api, tmp_path, inventory, agent_settings, pods=pods)
    yield allocator
    await allocator.events.drain()
    await pods.stop()


@pytest.fixture
async def stub(
    allocator: Allocator, inventory: Inventory, agent_settings: NodeSettings, sock_dir: Path
) -> AsyncIterator[Any]:
    """Kubelet's client of the device plugin around ``allocator``."""
    async with plugin_stub(allocator, inventory, agent_settings, sock_dir) as client:
        yield client
