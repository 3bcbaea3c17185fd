"""What a user most likely mistyped in a pod routed to us, refused before it silently does nothing. PURE.

Owns three rules the admission decision (:mod:`webhook.mutation`) applies to the pods it routes:

* **Resource names** (limits and requests of every init and app container). Ours are the configured
  :class:`~hami.settings.ResourceNames` (count, memory, memory percentage, cores, priority). A name
  that is not ours is judged only in HAMi's namespaces (:func:`judged_namespaces`): ``hami.io/`` and
  the namespaces of the configured card, memory and cores names -- ``nvidia.com/`` with HAMi's default
  names; when they are configured elsewhere (to run beside NVIDIA's own device plugin), ``nvidia.com/``
  is that plugin's and not judged.

  - Refused with a did-you-mean when it looks like one of ours (:func:`did_you_mean`: the part after
    the ``/`` compared case-insensitively with :mod:`difflib`, ratio >= 0.75, or ours followed by more
    letters: ``gpumemory`` -> ``gpumem``).
  - Otherwise refused in ``hami.io/`` (nothing but us serves a resource there), and left alone in the
    other namespaces: ``nvidia.com/`` also holds other device plugins' resources -- NVIDIA's own
    (``nvidia.com/mig-1g.10gb``, ``nvidia.com/gpu.shared``: never judged), its network operator's
    (``nvidia.com/hostdev``), KubeVirt's passthrough names -- which a GPU pod may rightly ask for.

* **Annotation keys** in ``nvidia.com/`` and ``hami.io/``: the steering keys users set are known
  (:data:`USER_KEYS`), the internal ones are refused earlier as forged; any other key is refused, with
  a did-you-mean among the user keys or the list of them. Exceptions: HAMi's steering keys for other
  vendors' devices (``hami.io/use-<type>-uuid``, ``hami.io/no-use-<type>-uuid``), which a pod may carry
  for another scheduler's cards, pass; ``hami.io/webhook`` is pointed at ``metadata.labels``.

* **Zero cards**: a count of 0 next to a non-zero memory, memory percentage or cores asks for a share
  of no card (HAMi reads it as no GPU at all: the pod would run without one).

Messages name the container and the key. Must not import kopf, aiohttp, the Kubernetes client,
``logging``, ``os`` or ``time``.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping, Sequence

from hami.annotations import USER_POD_ANNOTATIONS, WEBHOOK_IGNORE_LABEL
from hami.core.requests import lookup, whole_number
from hami.settings import ResourceNames

UNKNOWN_RESOURCE = "unknown_resource"
UNKNOWN_ANNOTATION = "unknown_annotation"
ZERO_CARDS = "zero_cards"
REASONS = (UNKNOWN_RESOURCE, UNKNOWN_ANNOTATION, ZERO_CARDS)

#: HAMi's namespaces: annotation keys in them are judged; resource names in STRICT ones always are (and
#: refused even with no look-alike).
NAMESPACES = ("nvidia.com/", "hami.io/")
STRICT = ("hami.io/",)
#: NVIDIA device plugin resources, never judged: MIG (mixed strategy) and time-slicing renames.
NVIDIA_PLUGIN = re.compile(r"^nvidia\.com/(mig-[^/]+|[^/]+\.shared)$")
#: The steering annotations users set on pods (docs/protocol.md, "Steering"): the codec's list.
USER_KEYS = USER_POD_ANNOTATIONS
#: HAMi's per-vendor uuid steering keys (``hami.io/use-Ascend910B2-uuid``, ``hami.io/no-use-xpu-uuid``).
OTHER_VENDOR_KEY = re.compile(r"^hami\.io/(no-)?use-[A-Za-z0-9.]+-uuid$")
SIMILARITY = 0.75


def _local(name: str) -> str:
    return name.rpartition("/")[2].lower()


def _namespace(name: str) -> str:
    head, slash, _ = name.rpartition("/")
    return f"{head}/" if slash else ""


def did_you_mean(name: str, candidates: Sequence[str]) -> str | None:
    """The candidate ``name`` most likely meant: compared on the part after the ``/``, case-insensitively
    (``hami.io/gpucore`` -> ``nvidia.com/gpucores``); None when nothing is close."""
    by_local: dict[str, str] = {}
    for candidate in candidates:
        by_local.setdefault(_local(candidate), candidate)
    typed = _local(name)
    close = difflib.get_close_matches(typed, list(by_local), n=1, cutoff=SIMILARITY)
    if close:
        return by_local[close[0]]
    extended = [c for c in by_local if c and typed.startswith(c) and typed[len(c)].isalpha()]
    return by_local[max(extended, key=len)] if extended else None


def ours(resources: ResourceNames) -> tuple[str, ...]:
    """Every resource name we serve (the managed ones and the priority), as configured."""
    return tuple(n for n in (*resources.managed, resources.priority) if n)


def judged_namespaces(resources: ResourceNames) -> tuple[str, ...]:
    """Where resource names are judged: ``hami.io/``, then the namespaces of the configured card, memory
    and cores names (sorted; the priority alone does not claim a namespace)."""
    extra = sorted({_namespace(n) for n in resources.managed if n} - set(STRICT) - {""})
    return (*STRICT, *extra)


def resource_problems(container: str, names: Iterable[str], resources: ResourceNames) -> list[str]:
    """A message per resource name of ``container`` that is a typo by the rules above."""
    known = ours(resources)
    judged = judged_namespaces(resources)
    found = []
    for name in sorted(set(names)):
        if name in known or _namespace(name) not in judged or NVIDIA_PLUGIN.match(name):
            continue
        guess = did_you_mean(name, known)
        if guess is not None:
            found.append(f'container "{container}": unknown resource {name}; did you mean {guess}?')
        elif _namespace(name) in STRICT:
            found.append(
                f'container "{container}": unknown resource {name}; the resources HAMi serves are '
                + ", ".join(known)
            )
    return found


def annotation_problems(annotations: Mapping[str, object], internal: Iterable[str]) -> list[str]:
    """A message per annotation key in HAMi's namespaces that HAMi does not read (``internal`` keys are
    someone else's refusal)."""
    skip = {*USER_KEYS, *internal}
    found = []
    for key in sorted(annotations):
        if key in skip or _namespace(key) not in NAMESPACES or OTHER_VENDOR_KEY.match(key):
            continue
        if key == WEBHOOK_IGNORE_LABEL:
            found.append(f"annotation {key} is a label, not an annotation; set it under metadata.labels")
            continue
        guess = did_you_mean(key, USER_KEYS)
        if guess is not None:
            found.append(f"annotation {key} is not one HAMi reads; did you mean {guess}?")
        else:
            found.append(
                f"annotation {key} is not one HAMi reads; the pod annotations it reads are "
                + ", ".join(USER_KEYS)
            )
    return found


def zero_card_problem(
    container: str, limits: Mapping[str, str], requests: Mapping[str, str], resources: ResourceNames
) -> str | None:
    """The message when the card count is 0 but a share (memory, percentage, cores) is not."""
    if whole_number(lookup(resources.count, limits, requests)) != 0:
        return None
    for share in (resources.memory, resources.memory_percentage, resources.cores):
        text = lookup(share, limits, requests) if share else None
        value = whole_number(text)  # None: malformed, which the value checks report
        if value is not None and value != 0:
            return (
                f'container "{container}": {resources.count} "0" with {share} "{text}" asks for a share of '
                f"no card; ask for 1 or more cards, or remove {share}"
            )
    return None
