"""The NVML backend against the real nvidia-ml-py: every ``nvml*`` call in ``nodeagent.backends.nvml``
names a function the installed module has, with arguments that bind to its signature (pynvml mirrors
NVML's C calls, out-parameters included, so a call that does not fit fails only on a real card: the
MIG placement query did, on an H200); and the card's MIG profiles read through the C protocol of
``nvmlDeviceGetGpuInstancePossiblePlacements`` (count first with no array, then the array), with a
profile that has more placements than instances."""

from __future__ import annotations

import ast
import ctypes
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from nodeagent.backends import nvml as backend_module
from nodeagent.backends.nvml import NvmlBackend

from .test_agent_backends import FakeNvml, _fake


def nvml_calls() -> Iterator[tuple[str, int, ast.Call]]:
    tree = ast.parse(inspect.getsource(backend_module))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr.startswith("nvml")
        ):
            yield node.func.attr, node.lineno, node


CALLS = sorted(nvml_calls(), key=lambda call: call[1])


def test_the_backend_makes_nvml_calls() -> None:
    names = {name for name, _, _ in CALLS}
    assert {"nvmlInit", "nvmlDeviceGetCount", "nvmlDeviceGetGpuInstancePossiblePlacements"} <= names


@pytest.mark.parametrize(("name", "line", "call"), CALLS, ids=[f"{n}@{line}" for n, line, _ in CALLS])
def test_each_nvml_call_fits_the_installed_module(name: str, line: int, call: ast.Call) -> None:
    function = getattr(pynvml, name, None)
    assert callable(function), f"line {line}: pynvml has no {name}"
    assert not any(isinstance(a, ast.Starred) for a in call.args), f"line {line}: *args cannot be checked"
    assert all(k.arg is not None for k in call.keywords), f"line {line}: **kwargs cannot be checked"
    keywords = {str(k.arg): None for k in call.keywords}
    try:
        inspect.signature(function).bind(*[None] * len(call.args), **keywords)
    except TypeError as exc:
        pytest.fail(f"line {line}: {name}{inspect.signature(function)} does not take these arguments: {exc}")


# ---------------------------------------------------------------------------- MIG profiles, C protocol
#: profile index -> (name, slices, instance count, placement starts); "+me" has one instance, 7 places
PROFILES = {
    0: ("MIG 1g.18gb", 1, 7, tuple(range(7))),
    1: ("MIG 1g.18gb+me", 1, 1, tuple(range(7))),
    4: ("MIG 7g.141gb", 7, 1, (0,)),
}


@dataclass
class MigCapableNvml(FakeNvml):
    """FakeNvml plus the two profile calls, each as NVML's C API answers them."""

    NVML_GPU_INSTANCE_PROFILE_COUNT = 5
    placement_calls: int = 0

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: int, profile: int) -> Any:
        if profile not in PROFILES:
            raise pynvml.NVMLError_NotSupported(pynvml.NVML_ERROR_NOT_SUPPORTED)
        name, slices, count, _ = PROFILES[profile]
        return SimpleNamespace(
            id=profile + 100, name=name.encode(), sliceCount=slices, instanceCount=count,
            memorySizeMB=18 * 1024 * slices, multiprocessorCount=16 * slices,
        )  # fmt: skip

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, device: int, profileId: int, placementsRef: Any, countRef: Any
    ) -> int:
        self.placement_calls += 1
        starts = PROFILES[profileId - 100][3]
        count = ctypes.cast(countRef, ctypes.POINTER(ctypes.c_uint)).contents
        if placementsRef is None:
            count.value = len(starts)
            return 0  # NVML_SUCCESS
        if count.value < len(starts):
            raise pynvml.NVMLError_InsufficientSize(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        size = PROFILES[profileId - 100][1]
        for k, start in enumerate(starts):
            placementsRef[k].start, placementsRef[k].size = start, size
        count.value = len(starts)
        return 0  # NVML_SUCCESS


def test_mig_profiles_read_through_the_c_protocol(tmp_path: Path) -> None:
    fake = MigCapableNvml(gpus=_fake().gpus)
    backend = NvmlBackend(nvml=fake, sysfs=tmp_path)
    first, _ = backend.cards()
    assert [(p.name, p.instance_count, p.placements) for p in first.mig_profiles] == [
        ("1g.18gb", 7, tuple((s, 1) for s in range(7))),
        ("1g.18gb+me", 1, tuple((s, 1) for s in range(7))),
        ("7g.141gb", 1, ((0, 7),)),
    ]
    assert [p.cores for p in first.mig_profiles] == [15, 15, 100]
    assert fake.placement_calls == 2 * 3 * 2  # two cards, three profiles each: the count, then the array
    backend.cards()
    assert fake.placement_calls == 12  # hardware facts: read once per card
