"""The test kit's one contact with kmock's private internals: :func:`internals`.

kmock is the embedded apiserver's base (docs/testing.md, "The API server: kmock"). Its public API
(reactions, ``objects``, ``resources``, ``Server``) does not reach everything the emulator must do, so
the test kit uses, and only through the object :func:`internals` returns:

* the **store lock and watch buses** of ``KubernetesEmulator`` (``_lock``, ``_buses``): a write kmock
  lacks (PUT, an Event expiring) must change the store under kmock's lock and tell the watchers, and a
  watch with ``resourceVersion`` and selectors streams from the same bus;
* the **store's dict** (``KubernetesEmulator._objects._objects``, the ``ObjectsArray``'s plain dict):
  :mod:`hami_testkit.store_index` puts a dict that also indexes the keys by resource in its place, and
  answers kmock's fallbacks (``_serve_fetch``, ``_serve_create``, ``_serve_update``, ``_serve_delete``,
  overridden) by key instead of kmock's walk over every object;
* the **reaction list and each reaction's source, disabled flag and log** (``Root._payloads``,
  ``Chained._source``, ``Reaction._disabled``, ``Reaction._requests``) and the handler's request and
  error logs (``Root._requests``, ``RawHandler._errors``): kmock matches a request by walking its whole
  history, so :class:`hami_testkit.lean.LeanHandler` matches on the request alone and trims the logs;
* kmock's **request parser** (``Request._parse``, ``parsing.parse_path``) and ``StreamingError``, for the
  bodies and paths the emulator reads its own way (protobuf, namespaces);
* its **discovery** (``KubernetesScaffold._serve_version``, ``_get_resources``), served without the
  short names it copies onto subresources, and the OpenAPI built from the same resources;
* and the test kit **overrides** ``RawHandler._handle``, ``_render_error`` and ``_stream_error`` (checked
  here too: were one renamed, the override would silently stop being called).

kmock is pinned exactly (``testkit/pyproject.toml``). :func:`internals` checks once that the installed
kmock is that version and still has every name above, and raises :class:`KmockChanged` naming the
installed version and what moved otherwise; ``tests/testkit/test_kmock_pin.py`` runs the same check.
The upstream hooks that would remove this module: docs/testing.md, "kmock's internals".

Simulation only; no I/O. Must not import ``hami.kube``, ``webhook`` or ``nodeagent``.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
from dataclasses import dataclass
from typing import Any

import kmock
from kmock._internal import parsing as _parsing
from kmock._internal import rendering as _rendering

#: The kmock version this module was written against (``testkit/pyproject.toml`` pins it).
PINNED = "0.8"

#: (owner, attribute) pairs this module reads or the test kit overrides; instance attributes are
#: checked on a live emulator (:func:`missing`).
_CLASS_NAMES: tuple[tuple[Any, str], ...] = (
    (kmock.RawHandler, "_handle"),
    (kmock.RawHandler, "_render_error"),
    (kmock.RawHandler, "_stream_error"),
    (kmock.KubernetesEmulator, "_handle"),
    (kmock.KubernetesScaffold, "_serve_version"),
    (kmock.KubernetesEmulator, "_get_resources"),
    (kmock.KubernetesEmulator, "_serve_fetch"),
    (kmock.KubernetesEmulator, "_serve_create"),
    (kmock.KubernetesEmulator, "_serve_update"),
    (kmock.KubernetesEmulator, "_serve_delete"),
    (_rendering.Request, "_parse"),
    (_rendering, "StreamingError"),
    (_parsing, "parse_path"),
)
_INSTANCE_NAMES = ("_payloads", "_requests", "_errors", "_lock", "_buses", "_objects")
_REACTION_NAMES = ("_source", "_disabled", "_requests")

_checked: list[str] | None = None


def installed() -> str:
    """The installed kmock's version."""
    return importlib.metadata.version("kmock")


class KmockChanged(RuntimeError):
    """The installed kmock is not the one the test kit's use of its internals was written for."""


def missing(handler: kmock.KubernetesEmulator | None = None) -> list[str]:
    """What of kmock's internals this module needs is not there (or the version differs); ``[]``
    when all is as pinned. Checks ``handler`` (or a fresh emulator) and one of its reactions."""
    version = installed()
    problems = [] if version == PINNED else [f"kmock is {version}, not {PINNED}"]
    for owner, name in _CLASS_NAMES:
        if not hasattr(owner, name):
            problems.append(f"{getattr(owner, '__name__', owner)}.{name}")
    emulator = handler if handler is not None else kmock.KubernetesEmulator()
    problems += [f"KubernetesEmulator().{n}" for n in _INSTANCE_NAMES if not hasattr(emulator, n)]
    if not isinstance(getattr(getattr(emulator, "_objects", None), "_objects", None), dict):
        problems.append("KubernetesEmulator()._objects._objects (the store's dict)")
    reactions = list(getattr(emulator, "_payloads", []))
    if not reactions:
        problems.append("KubernetesEmulator() has no fallback reactions in _payloads")
    else:
        problems += [f"Reaction.{n}" for n in _REACTION_NAMES if not hasattr(reactions[0], n)]
    return problems


def _check() -> None:
    global _checked
    if _checked is None:
        _checked = missing()
    if _checked:
        raise KmockChanged(
            f"kmock {installed()} is installed; hami_testkit.kmock_seam reads kmock {PINNED}'s "
            f"internals and these moved: {', '.join(_checked)} (pin kmock=={PINNED} or port the seam; "
            "docs/testing.md says how)"
        )


@dataclass(frozen=True)
class Internals:
    """kmock's private parts of one handler or emulator (see the module docstring)."""

    handler: Any

    @property
    def reactions(self) -> list[kmock.Reaction]:
        """Every reaction, in the order added (``Root._payloads``)."""
        payloads: list[kmock.Reaction] = self.handler._payloads
        return payloads

    @property
    def requests(self) -> list[kmock.Request]:
        """The handler's request log (``Root._requests``)."""
        log: list[kmock.Request] = self.handler._requests
        return log

    @property
    def errors(self) -> list[list[Exception]]:
        """The errors answered, one list per entered context (``RawHandler._errors``)."""
        errors: list[list[Exception]] = self.handler._errors
        return errors

    @property
    def store_lock(self) -> asyncio.Lock:
        """Held by kmock around every change of the store (``KubernetesEmulator._lock``)."""
        lock: asyncio.Lock = self.handler._lock
        return lock

    @property
    def object_table(self) -> dict[Any, Any]:
        """The store's dict, ``(resource, namespace, name)`` -> kmock's object view
        (``KubernetesEmulator._objects._objects``; reading it walks nothing)."""
        table: dict[Any, Any] = self.handler._objects._objects
        return table

    def replace_object_table(self, table: dict[Any, Any]) -> None:
        """Replace the store's dict (with one holding the same items)."""
        object.__setattr__(self.handler._objects, "_objects", table)  # an attrs frozen class

    def bus(self, resource: kmock.resource) -> Any:
        """The watch events of ``resource`` (``KubernetesEmulator._buses``: ``put`` an event, or
        iterate to follow it)."""
        return self.handler._buses[resource]

    async def discovery(self, request: kmock.Request) -> Any:
        """kmock's ``APIResourceList`` for the request's group version (``_serve_version``)."""
        return await self.handler._serve_version(request)

    def served_resources(self) -> list[kmock.resource]:
        """The resources kmock serves (``_get_resources``: declared, reacted to, or stored)."""
        resources: list[kmock.resource] = self.handler._get_resources()
        return resources

    @staticmethod
    def source(view: kmock.View) -> kmock.View:
        """The view a chained view (filter, priority, reaction) narrows (``Chained._source``)."""
        source: kmock.View = view._source  # type: ignore[attr-defined]
        return source

    @staticmethod
    def disabled(reaction: kmock.Reaction) -> asyncio.Event:
        """Set once a reaction is depleted or mismatched (``Reaction._disabled``)."""
        event: asyncio.Event = reaction._disabled
        return event

    @staticmethod
    def served(reaction: kmock.Reaction) -> list[kmock.Request]:
        """The requests a reaction answered (``Reaction._requests``)."""
        log: list[kmock.Request] = reaction._requests
        return log

    @staticmethod
    async def parse(raw_request: Any, number: int) -> kmock.Request:
        """kmock's reading of an aiohttp request (``Request._parse``)."""
        request: kmock.Request = await _rendering.Request._parse(raw_request, id=number)
        return request

    @staticmethod
    def parse_path(path: str) -> Any:
        """kmock's reading of an API path: ``group``, ``version``, ``plural``, ``namespace``, ``name``,
        ``subresource`` (``parsing.parse_path``)."""
        return _parsing.parse_path(path)

    #: Raised by kmock's handler when a streamed answer fails after its headers went out.
    StreamingError: type[Exception] = _rendering.StreamingError


def internals(handler: Any) -> Internals:
    """kmock's private parts of ``handler``: the one way the test kit reaches them (see the module
    docstring). Raises :class:`KmockChanged` when the installed kmock is not the pinned one."""
    _check()
    return Internals(handler)
