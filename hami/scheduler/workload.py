"""The target workload of the ``fragmentation`` policy, learned from the pods the scheduler sees.

Owns :class:`Workload` (a decayed histogram of request classes, fed by the snapshot with every pod the
pod watch shows, and the :class:`~hami.core.fragmentation.Target` built from it), :func:`parse_fallback`
(the ``--fragmentation-fallback`` text) and :data:`DEFAULT_FALLBACK`.

A *class* is what one container asks of each card: the card count, the memory (MiB, or a percentage of
each card), the cores, and the card types the pod allows (``nvidia.com/use-gputype``). Every pod is read
once, when the watch first shows it (by uid; a bounded memory of uids); one that asks for cards counts
as one observation, shared among its app containers with a device request. The snapshot hands its pods
over with :meth:`Workload.defer`: queued with the time they were shown and read later, a chunk at a
time by the ``workload-learning`` task (:meth:`Workload.learn_pending`), and in full before anything
reads the histogram or the target, so no answer ever sees a part of them and each pod weighs what it
would have weighed read at once. Reading 50,000 listed pods' requests is a third of the scheduler's
start; deferred, it comes after ``/readyz`` says ready instead of before. Weights decay with time: an
observation ``t`` seconds old weighs ``2^(-t / half_life)``. The target is the most frequent classes
covering 95 % of the weight (at most ``MAX_CLASSES``), each class's probability its share of their
weight; while the decayed weight of everything seen is below ``min_pods``, it is the configured fallback
instead. The target is looked at again at most every ``refresh`` seconds and replaced only when its
classes changed or a probability moved by more than ``DRIFT`` (a new target starts the core's memos
afresh, so every node is measured again once). The target also carries the cluster's cards per type
(:meth:`Workload.register`, fed by the snapshot with each node's registration), from which the core works
out what each type holds back for the pods restricted to it (``use-gputype``); a change of the supply
that moves a type's reserve by more than ``DRIFT`` rebuilds the target too. Unreadable pods are skipped;
the histogram holds at most ``MAX_TRACKED`` classes (the lightest one gives way), so hostile pods cannot
grow it. Must not import the Kubernetes client or aiohttp.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from hami import objects
from hami.annotations import AnnotationError, read_pod_request
from hami.core.allocate import Policy, uses_target
from hami.core.fragmentation import Target, TargetClass
from hami.core.model import PERCENT_NOT_GIVEN, NodeState, PodRequest
from hami.objects import pod_key
from hami.settings import DeviceConfig

#: Whole cards, halves and quarters, equally likely: the target until enough pods were seen.
DEFAULT_FALLBACK = "1:100%:100,1:50%:50,1:25%:25"
DEFAULT_HALF_LIFE = 6 * 3600.0
DEFAULT_MIN_PODS = 20.0
REFRESH_SECONDS = 60.0
COVERAGE = 0.95
MAX_CLASSES = 32  # in the target (each costs every node evaluation a little)
MAX_TRACKED = 1024  # in the histogram
MAX_SEEN = 100_000  # pod uids remembered so that a pod counts once
_REBASE = 64.0  # half-lives after which the stored weights are scaled back
DRIFT = 0.02  # a class's probability may move this much before the target is rebuilt

#: (cards, MiB, percentage, cores, allowed types)
ClassKey = tuple[int, int, int, int, tuple[str, ...]]


def parse_fallback(text: str) -> tuple[TargetClass, ...]:
    """``CARDS:MEMORY:CORES[:WEIGHT],...``; MEMORY is MiB or ``N%`` of each card. Raises ValueError."""
    classes: list[TargetClass] = []
    if text.count(",") >= MAX_CLASSES:
        raise ValueError(f"at most {MAX_CLASSES} classes")
    for entry in text.split(","):
        parts = [p.strip() for p in entry.split(":")]
        if len(parts) not in (3, 4):
            raise ValueError(f"{entry.strip()!r}: expected CARDS:MEMORY:CORES[:WEIGHT], e.g. 1:50%:50")
        try:
            nums, cores = int(parts[0]), int(parts[2])
            weight = float(parts[3]) if len(parts) == 4 else 1.0
            percent = parts[1].endswith("%")
            memory = int(parts[1].removesuffix("%"))
        except ValueError:
            raise ValueError(f"{entry.strip()!r}: CARDS, MEMORY and CORES must be whole numbers") from None
        if not 1 <= nums <= 64:
            raise ValueError(f"{entry.strip()!r}: CARDS must be 1..64")
        if not 0 <= cores <= 100:
            raise ValueError(f"{entry.strip()!r}: CORES must be 0..100")
        if not (1 <= memory <= 100 if percent else 1 <= memory <= 2**40):
            raise ValueError(f"{entry.strip()!r}: MEMORY must be 1..100 % or a positive number of MiB")
        if not (math.isfinite(weight) and 0 < weight <= 1e6):
            raise ValueError(f"{entry.strip()!r}: WEIGHT must be a positive number")
        classes.append(
            TargetClass(
                nums=nums,
                memory_mib=0 if percent else memory,
                percentage=memory if percent else PERCENT_NOT_GIVEN,
                cores=cores,
                weight=weight,
            )
        )
    return tuple(classes)


class Workload:
    """The decayed histogram and the target built from it (event-loop only, no locks)."""

    def __init__(
        self,
        *,
        device_config: DeviceConfig | None = None,
        half_life: float = DEFAULT_HALF_LIFE,
        min_pods: float = DEFAULT_MIN_PODS,
        fallback: tuple[TargetClass, ...] | None = None,
        clock: Callable[[], float] = time.monotonic,
        refresh: float = REFRESH_SECONDS,
    ) -> None:
        if not half_life > 0:
            raise ValueError("the half-life must be positive")
        self._config = device_config or DeviceConfig()
        self._half_life = half_life
        self._min_pods = min_pods
        self._fallback = Target(fallback if fallback is not None else parse_fallback(DEFAULT_FALLBACK))
        self._clock = clock
        self._refresh = refresh
        self._origin = clock()  # stored weights are scaled by 2^((t - origin) / half_life)
        self._weights: dict[ClassKey, float] = {}
        self._order: dict[ClassKey, int] = {}  # when each class entered the histogram (ties: oldest first)
        self._serial = 0
        #: (weight, order, class) for every class's current weight, among outdated entries (lazy deletion)
        self._lightest: list[tuple[float, int, ClassKey]] = []
        self._total = 0.0
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._target: Target | None = None
        self._built_at = -math.inf
        self._offers: dict[str, Counter[str]] = {}  # per node: its cards per type
        self._supply: Counter[str] = Counter()  # the sum of ``_offers``
        self._counted = 0  # pods counted since the start
        self.unreadable = 0  # pods whose reading failed other than on an annotation (none known)
        self._pending: deque[tuple[Mapping[str, Any], float]] = deque()  # (pod, when shown), unread
        #: called when the queue of deferred pods stops being empty (the learning task's wake-up)
        self.on_pending: Callable[[], None] | None = None

    # -------------------------------------------------------------------------------- the histogram

    def observe(self, pod: Mapping[str, Any]) -> None:
        """Count ``pod`` (a raw Pod) now if it asks for cards and was not counted before."""
        if self._first_sight(pod):
            self._learn_pending()
            self._learn(pod, self._clock())

    def defer(self, pod: Mapping[str, Any]) -> None:
        """Count ``pod`` as :meth:`observe` does, weighed as of now, but read it later: before the next
        read of the histogram or the target, or by :meth:`learn_pending`."""
        if self._first_sight(pod):
            self._pending.append((pod, self._clock()))
            if len(self._pending) == 1 and self.on_pending is not None:
                self.on_pending()

    @property
    def pending(self) -> int:
        """Deferred pods not read yet."""
        return len(self._pending)

    def learn_pending(self, limit: int) -> int:
        """Read up to ``limit`` deferred pods, the oldest first; the number still deferred after."""
        pending = self._pending
        for _ in range(min(limit, len(pending))):
            pod, when = pending.popleft()
            self._learn(pod, when)
        return len(pending)

    def _learn_pending(self) -> None:
        while self._pending:
            pod, when = self._pending.popleft()
            self._learn(pod, when)

    @property
    def observed(self) -> int:
        """Pods counted since the start (the deferred ones read first)."""
        self._learn_pending()
        return self._counted

    def _first_sight(self, pod: Mapping[str, Any]) -> bool:
        uid = objects.uid(pod) or "/".join(pod_key(pod))
        if uid in self._seen:
            return False
        self._seen[uid] = None  # counted or not, it is read once
        if len(self._seen) > MAX_SEEN:
            self._seen.popitem(last=False)
        return True

    def _learn(self, pod: Mapping[str, Any], now: float) -> None:
        try:
            request = read_pod_request(pod, self._config)
        except AnnotationError:
            return
        except Exception:  # read in a task of its own: one pod must never stop the learning
            self.unreadable += 1
            return
        keys = [
            (
                c.nums,
                c.memory_mib,
                c.percentage,
                min(c.cores, 100),
                tuple(t.lower() for t in request.use_types),
            )
            for c in request.containers[request.init_count :]
            if c is not None and c.nums > 0
        ]
        if not keys:
            return
        self._counted += 1
        if (now - self._origin) / self._half_life > _REBASE:
            self._rebase(now)
        weight = math.exp2((now - self._origin) / self._half_life) / len(keys)
        for key in keys:
            if key not in self._weights:
                if len(self._weights) >= MAX_TRACKED:
                    self._evict_lightest()
                self._serial += 1
                self._order[key] = self._serial
            total = self._weights[key] = self._weights.get(key, 0.0) + weight
            self._total += weight
            heapq.heappush(self._lightest, (total, self._order[key], key))
        if len(self._lightest) > 2 * len(self._weights) + 64:  # mostly outdated entries: rebuild
            self._reheap()

    def _evict_lightest(self) -> None:
        """Drop the lightest class (of equal weights, the one held longest: the first ``min`` over the
        histogram would name). The heap holds every class's current weight among outdated entries,
        which are skipped: O(log n) amortised where a scan of the histogram cost O(MAX_TRACKED) for
        every new class once the histogram is full (the scheduler's start read 50,000 pods of many
        classes)."""
        while self._lightest:
            weight, order, key = heapq.heappop(self._lightest)
            if self._weights.get(key) == weight and self._order.get(key) == order:
                self._total -= self._weights.pop(key)
                del self._order[key]
                return

    def _reheap(self) -> None:
        self._lightest = [(w, self._order[k], k) for k, w in self._weights.items()]
        heapq.heapify(self._lightest)

    def _rebase(self, now: float) -> None:
        scale = math.exp2(-(now - self._origin) / self._half_life)
        self._weights = {k: w * scale for k, w in self._weights.items() if w * scale > 1e-12}
        self._order = {k: self._order[k] for k in self._weights}
        self._reheap()
        self._total = math.fsum(self._weights.values())
        self._origin = now

    def weight(self) -> float:
        """The decayed weight of everything seen (pods, each container its share), now."""
        self._learn_pending()
        return self._total * math.exp2(-(self._clock() - self._origin) / self._half_life)

    def learned(self) -> tuple[TargetClass, ...]:
        """The most frequent classes covering ``COVERAGE`` of the weight (at most ``MAX_CLASSES``)."""
        self._learn_pending()
        ranked = sorted(self._weights.items(), key=lambda kv: (-kv[1], kv[0]))
        kept: list[TargetClass] = []
        covered = 0.0
        for (nums, memory, percentage, cores, types), weight in ranked[:MAX_CLASSES]:
            if covered >= COVERAGE * self._total:
                break
            kept.append(
                TargetClass(
                    nums=nums,
                    memory_mib=memory,
                    percentage=percentage,
                    cores=cores,
                    types=types,
                    weight=weight,
                )
            )
            covered += weight
        return tuple(kept)

    # ---------------------------------------------------------------------------------- the supply

    def register(self, node: str, state: NodeState | None) -> None:
        """The cards ``node`` registers (None: it is gone or registers none), counted per type."""
        old = self._offers.pop(node, None)
        if old is not None:
            self._supply.subtract(old)
            self._supply = +self._supply  # drop the types nobody offers any more
        if state is not None and state.devices:
            offer = Counter(d.device.type for d in state.devices)
            self._offers[node] = offer
            self._supply.update(offer)

    @property
    def supply(self) -> Mapping[str, int]:
        """The cluster's cards per type, as registered."""
        return self._supply

    # ------------------------------------------------------------------------------------ the target

    @property
    def is_learned(self) -> bool:
        return self.weight() >= self._min_pods and bool(self._weights)

    def target(self) -> Target:
        """The current target: the learned classes, or the fallback while too few pods were seen.

        Looked at again at most every ``refresh`` seconds; a target whose classes are the same and whose
        probabilities moved by at most ``DRIFT`` is kept (with its memos)."""
        now = self._clock()
        if self._target is not None and now - self._built_at < self._refresh:
            return self._target
        self._learn_pending()
        self._built_at = now
        fresh = Target(self.learned(), supply=self._supply) if self.is_learned else self._fallback
        if self._target is None or not _close(self._target, fresh):
            self._target = fresh
        return self._target

    def policy(self, base: Policy, request: PodRequest) -> Policy:
        """``base`` (the cluster's defaults) with the current target when deciding ``request`` reads it
        (a ``fragmentation`` node or card policy), else ``base`` as it is: a pod placed by ``binpack``
        or ``spread`` never waits for the workload to read the pods it was shown."""
        if not uses_target(request, base):
            return base
        return replace(base, target=self.target())


def _close(old: Target, new: Target) -> bool:
    """The same classes with probabilities, and the same types with reserves, within ``DRIFT`` of each
    other."""
    if old is new:
        return True
    if old.reserve.keys() != new.reserve.keys() or any(
        abs(value - new.reserve[name]) > DRIFT for name, value in old.reserve.items()
    ):
        return False
    shape = [replace(c, weight=0.0) for c in old.classes]
    if shape != [replace(c, weight=0.0) for c in new.classes]:
        return False
    old_total = math.fsum(c.weight for c in old.classes)
    new_total = math.fsum(c.weight for c in new.classes)
    return all(
        abs(a.weight / old_total - b.weight / new_total) <= DRIFT
        for a, b in zip(old.classes, new.classes, strict=True)
    )
