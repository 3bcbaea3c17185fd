#!/usr/bin/env bash
# The enforcement check on a real GPU (docs/security.md, "Enforcement modes", "On a real GPU").
#
# What it does, in one run bounded to under 5 minutes (each step has its own timeout):
#   1. records the driver (nvidia-smi) into $OUT/nvidia-smi.txt;
#   2. python3 -m tests.gpu.check: the node agent's Allocate answer for a 3,000 MiB grant on this
#      machine's card (read through the agent's NVML backend), applied to CuPy processes as a container
#      runtime applies it, with the HAMi-core library given in HAMI_CORE_LIB; and the MPS part where
#      the control daemon is there (see tests/gpu/check.py); writes $OUT/enforcement.json;
#   3. pytest -m gpu tests/gpu: the same claims as tests, judged on that enforcement.json
#      ($OUT/pytest.log; SKIP_PYTEST=1 leaves it out);
#   4. $OUT/summary.txt: each step's exit status. Exits with the check's status (0 = every verdict as
#      expected, 1 = a verdict differs, 2 = could not run), or 3 when a step timed out.
# It never changes the card's settings (no MIG, compute-mode or clock change, no reset) and writes
# only under $OUT, its scratch directory and, inside private mount namespaces, the mounts it makes.
#
# The library. This repository holds no copy of HAMi-core and no recipe for building it (its
# repository carries no license file: docs/install.md, "In-container limits"); this script builds
# nothing. Fill the ignored folder .gpu-deps/ from HAMi-core's public repository on the working
# machine, never committing it:
#     fetch github:Project-HAMi/HAMi-core        (the session's fetch tool; prints the git directory)
#     mkdir -p .gpu-deps/HAMi-core
#     git --git-dir=/work/.mirror/Project-HAMi+HAMi-core/repo archive HEAD | tar -x -C .gpu-deps/HAMi-core
# then, in the same device `run` call and before this script, build libvgpu.so there with HAMi-core's
# own build files (its CMake project; only the library target is needed) and pass the file:
#     run(command="<build> && HAMI_CORE_LIB=<the built libvgpu.so> bash tests/gpu/device_check.sh",
#         carry=[".gpu-deps"], timeout_s=480)
# Without HAMI_CORE_LIB the default is .gpu-deps/libvgpu.so. What comes back: $OUT/enforcement.json,
# nvidia-smi.txt, pytest.log, summary.txt, device_check.log.

set -u -o pipefail

cd "$(dirname "$0")/../.." || exit 2
OUT="${OUT:-$PWD/gpu-out}"
LIBRARY="${HAMI_CORE_LIB:-.gpu-deps/libvgpu.so}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$OUT" || exit 2
exec > >(tee "$OUT/device_check.log") 2>&1

export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HAMI_CORE_LIB="$LIBRARY"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
timed_out=0
summary="$OUT/summary.txt"
: > "$summary"

step() {  # step NAME SECONDS COMMAND...: run it bounded, note its status
    local name=$1 seconds=$2 status
    shift 2
    echo "== $name (at most ${seconds}s)"
    timeout --kill-after=10 "$seconds" "$@"
    status=$?
    if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
        timed_out=1
        echo "$name: timed out after ${seconds}s" | tee -a "$summary"
    else
        echo "$name: exit $status" | tee -a "$summary"
    fi
    return "$status"
}

step nvidia-smi 20 nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
step driver 20 nvidia-smi --query-gpu=driver_version,name,uuid,memory.total,compute_mode,mig.mode.current \
    --format=csv
echo "library: $LIBRARY"
ls -l "$LIBRARY" || echo "no library at $LIBRARY: the check will say it cannot run"

step check 200 "$PYTHON" -m tests.gpu.check --library "$LIBRARY" --out "$OUT"
check=$?

if [ "${SKIP_PYTEST:-0}" != 1 ]; then
    # --confcutdir: the suite's own conftest files need the test kit (kmock), not on the GPU machine
    export HAMI_GPU_REPORT="$OUT/enforcement.json"
    step pytest 60 "$PYTHON" -m pytest -q -p no:cacheprovider -p no:xdist \
        -o addopts= --confcutdir=tests/gpu -m gpu tests/gpu > "$OUT/pytest.log" 2>&1
fi

if [ "$timed_out" -eq 1 ]; then
    exit 3
fi
exit "$check"
