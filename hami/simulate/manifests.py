"""``--pods DIR``: pod manifests (YAML or JSON, ``Pod`` or ``List`` of pods) as the replay's pod list.

Owns :func:`read_manifest_pods` and :func:`pod_requests`. CPU and memory are the pod's requests as
kube-scheduler counts them (app containers summed against the largest init container). The GPU request
is read with the codec (:func:`hami.annotations.read_pod_request`, HAMi's rules and default device
config) and must be expressible as a trace pod: one container asking for cards, a share of a card given
as ``gpumem-percentage`` (or nothing: a whole card); an absolute ``gpumem`` in MiB has no meaning on the
trace's abstract cards and is refused. ``nvidia.com/use-gputype`` becomes the allowed models.
Every refusal names the file and the pod. Reads files only; no cluster.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from hami import objects
from hami.annotations import AnnotationError, read_pod_request
from hami.core.model import PERCENT_NOT_GIVEN
from hami.core.quantity import QuantityError, parse_quantity
from hami.objects import RawContainer
from hami.settings import from_device_config
from hami.simulate.trace import MAX_BYTES, MILLI, TraceError, TracePod

MIB = 2**20
SUFFIXES = (".yaml", ".yml", ".json")
MAX_FILES = 10_000


def amount(text: Any, scale: int, divide: int = 1) -> int:
    """A quantity in the unit ``scale``/``divide`` (CPU: x1000 -> milli; memory: /2**20 -> MiB); 0 if bad."""
    try:
        value = parse_quantity(str(text)).value
    except QuantityError:
        return 0
    return max(0, int(value * scale // divide))


def pod_requests(pod: Mapping[str, Any]) -> tuple[int, int]:
    """(milli-CPU, MiB) the pod holds on its node: app containers summed vs the largest init container."""

    def one(container: RawContainer) -> tuple[int, int]:
        resources = container.get("resources")
        requests = resources.get("requests") if isinstance(resources, Mapping) else None
        if not isinstance(requests, Mapping):
            return 0, 0
        return amount(requests.get("cpu", "0"), 1000), amount(requests.get("memory", "0"), 1, MIB)

    apps = [one(c) for c in objects.containers(pod)]
    inits = [one(c) for c in objects.init_containers(pod)]
    cpu = max([sum(a[0] for a in apps), *(i[0] for i in inits)])
    memory = max([sum(a[1] for a in apps), *(i[1] for i in inits)])
    return cpu, memory


def _documents(path: Path) -> Iterator[Mapping[str, Any]]:
    if path.stat().st_size > MAX_BYTES:
        raise TraceError(f"{path}: larger than {MAX_BYTES // 2**20} MiB")
    try:
        docs = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: not YAML/JSON: {exc}") from None
    for doc in docs:
        if not isinstance(doc, Mapping):
            continue
        if doc.get("kind") in ("List", "PodList"):
            yield from (item for item in doc.get("items") or [] if isinstance(item, Mapping))
        elif doc.get("kind") == "Pod":
            yield doc


def trace_pod(pod: Mapping[str, Any], where: str) -> TracePod:
    """One manifest as a trace pod (see the module docstring for what can be replayed)."""
    name = f"{objects.namespace(pod) or 'default'}/{objects.name(pod) or '?'}"
    try:
        request = read_pod_request(pod, from_device_config(None))
    except AnnotationError as exc:
        raise TraceError(f"{where}: pod {name}: {exc}") from None
    cards = [c for c in request.containers if c is not None and c.nums > 0]
    cpu, memory = pod_requests(pod)
    if not cards:
        return TracePod(name=name, cpu_milli=cpu, memory_mib=memory, num_gpu=0, gpu_milli=0)
    if len(cards) > 1:
        raise TraceError(
            f"{where}: pod {name}: several containers ask for cards; a trace pod has one request"
        )
    card = cards[0]
    if card.memory_mib > 0:
        raise TraceError(f"{where}: pod {name}: gpumem in MiB cannot be replayed; ask gpumem-percentage")
    milli = MILLI if card.percentage == PERCENT_NOT_GIVEN else card.percentage * MILLI // 100
    if card.nums > 1 and milli != MILLI:
        raise TraceError(
            f"{where}: pod {name}: a share of {milli} milli on {card.nums} cards; only one can be shared"
        )
    return TracePod(
        name=name,
        cpu_milli=cpu,
        memory_mib=memory,
        num_gpu=card.nums,
        gpu_milli=milli,
        gpu_spec=request.use_types,
    )


def read_manifest_pods(folder: str | Path) -> tuple[TracePod, ...]:
    """Every Pod in the folder's ``*.yaml``/``*.yml``/``*.json`` files, in file-name order."""
    root = Path(folder)
    files = sorted(p for p in root.iterdir() if p.suffix in SUFFIXES and p.is_file())
    if len(files) > MAX_FILES:
        raise TraceError(f"{root}: more than {MAX_FILES} manifest files")
    pods = [trace_pod(doc, str(path)) for path in files for doc in _documents(path)]
    if not pods:
        raise TraceError(f"{root}: no Pod manifests (*.yaml, *.yml, *.json)")
    return tuple(pods)
