"""The ``gpu`` marker for tests/gpu: a marked test runs only where NVIDIA's NVML library loads (the
rule of tests/nodeagent/conftest.py, kept here without its imports: on the GPU machine this folder runs
alone, ``--confcutdir=tests/gpu``, with no Kubernetes test kit)."""

from __future__ import annotations

import ctypes
import functools

import pytest


@functools.cache
def nvml_library_here() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is not None and not nvml_library_here():
        pytest.skip("needs the NVIDIA driver's NVML library (libnvidia-ml.so.1) on this host")
