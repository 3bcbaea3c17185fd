"""The process inside the emulated container: ``python3 -m tests.gpu.probe MIB...``.

Owns what one tenant process sees: whether HAMi-core is mapped into it, whether ``/etc/ld.so.preload``
can be opened for writing (a read-only mount refuses even root), the card memory CUDA reports, and for
each size in turn whether CuPy can allocate it with ``cudaMalloc`` (freed before the next). Prints one
JSON object as its last line; never raises (an error is a field). Needs CuPy only when sizes are given.
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


def main(argv: list[str]) -> int:
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
