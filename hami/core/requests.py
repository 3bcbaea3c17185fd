"""One container's resources -> its device request, exactly as HAMi reads them (docs/protocol.md, "Requests").

Owns :func:`parse_container` (with :func:`card_count`, the one reader of a container's card count)
and the :class:`RequestProblem` texts the webhook shows users. The
request follows HAMi to the letter (a malformed value empties or ignores exactly what HAMi empties or
ignores); ``problems`` says, for every managed resource value that is malformed, what is wrong with
it, naming the container and the resource, whether or not it changed the outcome. With
:class:`Bounds` (the webhook's) it also reports, once per value, what HAMi would clamp or ignore:
more cards than ``max_cards``, ``gpucores`` above 100, a ``gpumem-percentage`` of 0. Every value range
and its message lives here; the webhook only maps problems to its reason codes.
Pure: imports ``hami.settings``, ``hami.core`` and the stdlib only; no clock, no env, no logging.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from hami.core.model import NVIDIA, PERCENT_NOT_GIVEN, ContainerRequest
from hami.core.quantity import INT32_MAX, INT32_MIN, QuantityError, parse_quantity
from hami.settings import DeviceConfig

ProblemKind = Literal["value", "too_many_cards"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestProblem:
    """Why a container's value was not taken as written. ``message`` names container and field."""

    container: str
    field: str  # the resource name, e.g. "nvidia.com/gpumem"
    value: str  # the text as written
    message: str
    kind: ProblemKind = "value"  # "too_many_cards": a card count beyond Bounds.max_cards


@dataclass(frozen=True, slots=True, kw_only=True)
class Bounds:
    """Admission's limits on values HAMi accepts but clamps or ignores (the webhook refuses them).

    ``max_cards`` cards per container (``--max-cards-per-container``); ``gpucores`` at most 100 (HAMi
    clamps it in Fit); ``gpumem-percentage`` at least 1 (HAMi ignores 0 and books a whole card).
    """

    max_cards: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ParsedContainer:
    """The outcome for one container: its request (None = asks for no device) and the problems."""

    name: str
    request: ContainerRequest | None
    problems: tuple[RequestProblem, ...] = ()


def lookup(name: str, limits: Mapping[str, str], requests: Mapping[str, str]) -> str | None:
    """A resource's text: ``limits`` first, ``requests`` only when absent from limits (HAMi order)."""
    if name in limits:
        return limits[name]
    return requests.get(name)


def whole_number(text: str | None) -> int | None:
    """The plain integer a resource text names (``"100"``, not ``"1e2"`` or ``"0.5"``), else None
    (absent, not a quantity, or not a plain integer for Go: the value checks report those)."""
    if text is None:
        return None
    try:
        return parse_quantity(text).plain_int
    except QuantityError:
        return None


def card_count(name: str, limits: Mapping[str, str], requests: Mapping[str, str]) -> int | None:
    """The card count a container asks for under resource ``name``, read as :func:`parse_container`
    reads it (:func:`lookup`, then :func:`whole_number`): 0 when absent, None when not a plain
    non-negative whole number. The one reader of a container's card count (the node agent's hand-out
    checks match kubelet's calls with it)."""
    text = lookup(name, limits, requests)
    if text is None:
        return 0
    value = whole_number(text)
    return value if value is not None and value >= 0 else None


def parse_container(
    name: str,
    limits: Mapping[str, str],
    requests: Mapping[str, str],
    config: DeviceConfig,
    *,
    bounds: Bounds | None = None,
) -> ParsedContainer:
    """Turn one container's ``limits``/``requests`` into HAMi's request (docs/protocol.md, "Requests").

    ``bounds`` adds the admission problems (:class:`Bounds`); they never change the request.
    """
    res = config.resources
    factor = config.effective_memory_factor
    problems: list[RequestProblem] = []

    def problem(field: str, value: str, why: str, kind: ProblemKind = "value") -> None:
        problems.append(
            RequestProblem(
                container=name,
                field=field,
                value=value,
                message=f'container "{name}": {field} "{value}" {why}',
                kind=kind,
            )
        )

    def integer(field: str, value: str, unit: str) -> int | None:
        """The plain integer written, or None after recording why it is not one."""
        try:
            quantity = parse_quantity(value)
        except QuantityError:
            problem(field, value, f"is not a quantity; write a whole number{unit}")
            return None
        if quantity.plain_int is None:
            problem(field, value, f"is not a whole number{unit}")
        return quantity.plain_int

    # 1. count: absent or not a plain integer -> no request at all.
    count_text = lookup(res.count, limits, requests)  # card_count reads it alike, without the problems
    nums = integer(res.count, count_text, "") if count_text is not None else None
    if nums is not None and nums < 0:
        problem(res.count, str(count_text), "must not be negative")
    elif nums is not None and bounds is not None and nums > bounds.max_cards:
        problem(res.count, str(count_text), f"asks for more than {bounds.max_cards} cards", "too_many_cards")

    # 2. memory: a plain integer in [0, MaxInt32 / factor], else the WHOLE request is empty.
    memory = 0
    memory_ok = True
    memory_text = lookup(res.memory, limits, requests)
    if memory_text is not None:
        limit = INT32_MAX // factor
        value = integer(res.memory, memory_text, " of MiB")
        if value is None:
            memory_ok = False
        elif value < 0:
            memory_ok = False
            problem(res.memory, memory_text, "must not be negative")
        elif value > limit:
            memory_ok = False
            problem(
                res.memory,
                memory_text,
                f"is {value} MiB, more than the maximum {limit} MiB "
                f"({res.memory} counts MiB: write 16384 for 16 GiB)",
            )
        else:
            memory = value * factor

    # 3. percentage: sentinel 101 = not given; >100 clamps to 100 (before 32-bit narrowing); <=0 ignored.
    percentage = PERCENT_NOT_GIVEN
    pct_text = lookup(res.memory_percentage, limits, requests)
    if pct_text is not None:
        value = integer(res.memory_percentage, pct_text, " between 0 and 100")
        if value is not None:
            if not 0 <= value <= 100:
                problem(res.memory_percentage, pct_text, "must be between 0 and 100")
            elif value == 0 and bounds is not None:
                why = "must be between 1 and 100 (percent of a card's memory)"
                problem(res.memory_percentage, pct_text, why)
            if value > 100:
                percentage = 100
            elif value > 0:
                percentage = value

    # 4. default memory: neither memory nor percentage -> defaultMemory, or else the whole card.
    if percentage == PERCENT_NOT_GIVEN and memory == 0:
        if config.default_memory != 0:
            memory = config.default_memory
        else:
            percentage = 100

    # 5. cores: defaultCores unless a plain integer is given; >100 is clamped later by Fit, not here.
    cores = config.default_cores
    cores_text = lookup(res.cores, limits, requests)
    if cores_text is not None:
        value = integer(res.cores, cores_text, " percent")
        if value is not None and not INT32_MIN <= value <= INT32_MAX:
            # HAMi narrows to int32 (wrapping); we refuse the value instead and keep the default.
            problem(res.cores, cores_text, "is out of range")
        elif value is not None and value < 0:
            problem(res.cores, cores_text, "must not be negative")
            cores = value
        elif value is not None:
            cores = value
            if value > 100 and bounds is not None:
                problem(res.cores, cores_text, "must be between 0 and 100 (percent of a card)")

    if nums is None or nums <= 0 or not memory_ok:
        return ParsedContainer(name=name, request=None, problems=tuple(problems))
    request = ContainerRequest(nums=nums, type=NVIDIA, memory_mib=memory, percentage=percentage, cores=cores)
    return ParsedContainer(name=name, request=request, problems=tuple(problems))
