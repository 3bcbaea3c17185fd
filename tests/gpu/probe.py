"""The process inside the emulated container: ``python3 -m tests.gpu.probe [--hold] MIB...``.

Owns what one tenant process sees: whether HAMi-core is mapped into it, whether ``/etc/ld.so.preload``
can be opened for writing (a read-only mount refuses even root), the card memory CUDA reports, and for
each size in turn whether CuPy can allocate it with ``cudaMalloc`` (freed before the next). Prints one
JSON object as its last line; never raises (an error is a field). Needs CuPy only when sizes are given.

``--hold MIB``: the neighbour. Fills MIB MiB with a pattern, prints ``{"held": true, ...}`` (or the
error), keeps the memory until its stdin closes, then checks the pattern is still whole and prints
``{"stands": true|false, ...}``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

MIB = 1024 * 1024
PRELOAD = Path("/etc/ld.so.preload")


def mapped_libraries() -> list[str]:
    """The shared objects in this process whose name mentions ``vgpu`` (HAMi-core's ``libvgpu.so``)."""
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return []
    return sorted({line.split()[-1] for line in lines if "vgpu" in line.split()[-1]})


def preload_writable() -> bool | None:
    """True when ``/etc/ld.so.preload`` opens for appending (nothing is written); None when it is absent."""
    if not PRELOAD.exists():
        return None
    try:
        with PRELOAD.open("ab"):
            return True
    except OSError:
        return False


def allocations(sizes: list[int]) -> dict[str, Any]:
    try:
        import cupy  # type: ignore[import-not-found, unused-ignore]  # only on the GPU machine
    except ImportError as exc:
        return {"error": f"CuPy is not importable: {exc}"}
    runtime: Any = cupy.cuda.runtime
    found: dict[str, Any] = {}
    try:
        free, total = runtime.memGetInfo()
        found["free_mib"], found["total_mib"] = int(free) // MIB, int(total) // MIB
    except Exception as exc:  # any CUDA failure is a finding, not a crash
        return {"error": f"cudaMemGetInfo failed: {exc}"}
    tries: list[dict[str, Any]] = []
    for mib in sizes:
        try:
            pointer = runtime.malloc(mib * MIB)
        except Exception as exc:
            tries.append({"mib": mib, "ok": False, "error": str(exc)})
            continue
        runtime.free(pointer)
        tries.append({"mib": mib, "ok": True})
    found["allocations"] = tries
    return found


def hold(mib: int) -> int:
    """The neighbour: keep ``mib`` MiB filled with a pattern until stdin closes, then check it."""
    try:
        import cupy  # type: ignore[import-not-found, unused-ignore]  # only on the GPU machine
    except ImportError as exc:
        print(json.dumps({"held": False, "error": f"CuPy is not importable: {exc}"}), flush=True)
        return 0
    try:
        block = cupy.full(mib * MIB, 0x5A, dtype=cupy.uint8)
        cupy.cuda.runtime.deviceSynchronize()
    except Exception as exc:  # a refusal is a finding
        print(json.dumps({"held": False, "error": str(exc)}), flush=True)
        return 0
    print(json.dumps({"held": True, "mib": mib, "mapped": mapped_libraries()}), flush=True)
    sys.stdin.read()
    try:
        # reductions to one value each: a full-size comparison would need another MIB MiB, beyond a
        # grant the held block already nearly fills (the first real-GPU run hit exactly that)
        whole = int(block.min()) == 0x5A == int(block.max())
    except Exception as exc:
        print(json.dumps({"held": True, "stands": False, "error": str(exc)}), flush=True)
        return 0
    print(json.dumps({"held": True, "stands": whole, "mib": mib}), flush=True)
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--hold"]:
        if len(argv) != 2 or not argv[1].isdigit():
            print(json.dumps({"error": f"--hold takes one whole MiB, got {argv[1:]}"}))
            return 2
        return hold(int(argv[1]))
    try:
        sizes = [int(text) for text in argv]
    except ValueError:
        print(json.dumps({"error": f"sizes must be whole MiB, got {argv}"}))
        return 2
    result: dict[str, Any] = {"preload_writable": preload_writable()}
    if sizes:
        result.update(allocations(sizes))
    result["mapped"] = mapped_libraries()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
