"""kmock's request handling at a constant cost per request: reactions matched on the request alone, and
bounded logs.

kmock 0.8 decides whether a reaction applies to a request by asking whether the request is among the
requests its filter chain *has seen*, which it answers by walking the whole request history through
that chain, for every reaction, on every request: the cost of a request grows with the number served
before it (``/version`` took 20 s after half an hour of ``hami demo``). It also keeps every request,
every request each reaction served, and every version of every object forever.

:class:`LeanHandler` is a mixin placed between kmock's emulator and its ``RawHandler`` (see
:class:`hami_testkit.apiserver.AdmittingEmulator`) that

* answers "does this reaction see this request" from the request itself for the chains that depend on
  nothing else (filters, priorities: everything the embedded cluster and the tests' fault injection
  use), and falls back to kmock's own walk over the history for the others (slices, groups, streams);
  a criterion that reads only the request's method, action, resource or subresource (most of them) is
  asked once per value of those and its answer remembered;
* keeps, when :attr:`LeanHandler.request_log` is set, only about that many of the latest requests (the
  root's and each reaction's; each one logged holds its aiohttp request, body and parsed data, some
  10 KiB), only each object's latest version, and no deleted object at all (kmock keeps its last
  version and a deletion marker forever: every pod ever deleted);
* expires Events as kube-apiserver does (``--event-ttl``, 1 h by default: :attr:`LeanHandler.event_ttl`
  after their last write) and, with :attr:`LeanHandler.event_limit`, keeps at most that many (the
  oldest written go first; a real cluster leaves that bound to etcd's quota); each expired Event is
  deleted the way a DELETE deletes it, so watchers see it go;
* answers a body that is not UTF-8 text (protobuf, CBOR) with 415 Unsupported Media Type, as
  kube-apiserver does for a content type it does not serve, instead of failing to decode it (a
  subclass's :meth:`LeanHandler._parse` may read some of them: the emulator reads protobuf).

kmock's private parts it needs (the reaction list, the logs, the parser, the store lock and watch buses)
come through :func:`hami_testkit.kmock_seam.internals`, the test kit's one contact with them; it
overrides kmock's ``_handle`` (checked by that module too).

Simulation only. Must not import ``hami.kube``, ``webhook`` or ``nodeagent``.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

import aiohttp.web
import kmock

from hami import objects
from hami_testkit.kmock_seam import Internals, internals

#: kmock's "this reaction does not apply after all" (exported by kmock, missing from its ``__all__``).
_MISMATCH: type[Exception] = getattr(kmock, "ReactionMismatchError")  # noqa: B009

#: Content types of request bodies the embedded apiserver cannot decode (answered 415).
_BINARY_TYPES = ("protobuf", "cbor")
#: kube-apiserver's ``--event-ttl`` default: an Event lives this long after its last write.
EVENT_TTL = 3600.0
#: How many Events the embedded apiserver keeps at most (some 1-2 KiB each).
EVENT_LIMIT = 1000
_WRITES = (kmock.action.CREATE, kmock.action.UPDATE, kmock.action.DELETE)


#: The request fields kmock's HTTP and K8s criteria read for each of their own fields, for those with a
#: few values only (a method, an action, a resource, a subresource): a criterion that sets only these
#: gives the same answer for every request with the same values (:func:`_criterion_holds`).
_FEW_VALUED: dict[type, dict[str, Any]] = {
    getattr(kmock, "HTTPCriteria"): {"method": lambda request: request.method},  # noqa: B009  (not in __all__)
    getattr(kmock, "K8sCriteria"): {  # noqa: B009
        "method": lambda request: request.method,
        "action": lambda request: request.action,
        "resource": lambda request: request.resource,
        "subresource": lambda request: request.subresource,
    },
}
#: criterion -> the fields it sets, when all of them are few-valued; None when one is not.
_READS: dict[Any, tuple[str, ...] | None] = {}
#: (criterion, the request's values of those fields) -> kmock's answer.
_HOLDS: dict[tuple[Any, tuple[Any, ...]], bool] = {}
_MEMO_LIMIT = 4096


def _reads(criteria: Any) -> tuple[str, ...] | None:
    """The few-valued fields ``criteria`` sets, if it sets no other field (else None: not memoised)."""
    try:
        return _READS[criteria]
    except KeyError:
        pass
    except TypeError:  # unhashable (a dict of params or headers): never memoised
        return None
    fields = _FEW_VALUED.get(type(criteria))
    reads: tuple[str, ...] | None = None
    if fields is not None:
        declared = getattr(type(criteria), "__attrs_attrs__", ())  # attrs' public field list
        names = [a.name for a in declared if getattr(criteria, a.name) is not ...]
        reads = tuple(names) if all(name in fields for name in names) else None
    if len(_READS) < _MEMO_LIMIT:
        _READS[criteria] = reads
    return reads


def _criterion_holds(criteria: Any, request: kmock.Request) -> bool:
    """kmock's answer of ``criteria`` for ``request``, remembered for the criteria that read only
    few-valued fields (kmock's matching of an enum runs regular expressions: some 10 µs a criterion, and a
    request passes some twenty reactions' criteria)."""
    reads = _reads(criteria)
    if reads is None:
        return bool(criteria(request))
    fields = _FEW_VALUED[type(criteria)]
    key = (criteria, tuple(fields[name](request) for name in reads))
    try:
        return _HOLDS[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable value: ask kmock
        return bool(criteria(request))
    holds = bool(criteria(request))
    if len(_HOLDS) < _MEMO_LIMIT:
        _HOLDS[key] = holds
    return holds


def sees(view: kmock.View, request: kmock.Request, root: kmock.Root) -> bool:
    """Does ``view`` see ``request`` (which arrived at ``root``)? kmock's answer, in O(chain)."""
    if isinstance(view, kmock.Root):
        return view is root
    if type(view) is kmock.Filter:
        return sees(Internals.source(view), request, root) and _criterion_holds(view.criteria, request)
    if type(view) is kmock.Priority:
        return sees(Internals.source(view), request, root)
    return request in view  # kmock's own answer (walks the history the chain sees)


class LeanHandler(kmock.RawHandler):
    """Constant-cost matching and bounded logs for a kmock handler (see the module docstring)."""

    #: Keep about this many latest requests (None: keep all, as kmock does; tests that count use it).
    request_log: int | None = None
    #: Seconds an Event lives after its last write, and how many are kept at most (None: no bound).
    event_ttl: float = EVENT_TTL
    event_limit: int | None = None
    _events: OrderedDict[Any, float] | None = None  # Event key -> its last write (clock), oldest first
    _order_key: tuple[int, ...] = ()
    _order: list[kmock.Reaction] = []  # noqa: RUF012  (replaced per instance)
    _served = 0

    @property
    def served(self) -> int:
        """How many requests this handler has received (also after the log was trimmed)."""
        return self._served

    def _ordered_payloads(self) -> list[kmock.Reaction]:
        """The reactions by priority, highest first (kmock's order), recomputed when they change."""
        payloads = list(internals(self).reactions)
        key = tuple(id(p) for p in payloads)
        if key != self._order_key:
            priorities = [tuple(-p for p in payload.priorities) for payload in payloads]
            width = max((len(p) for p in priorities), default=0)
            padded = [p + (0,) * (width - len(p)) for p in priorities]
            indexes = sorted(range(len(payloads)), key=lambda index: padded[index])
            self._order = [payloads[index] for index in indexes]
            self._order_key = key
        return self._order

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        if self.request_log is not None:
            self._trim_object(request)
        for payload in self._ordered_payloads():
            disabled = Internals.disabled(payload)
            if disabled.is_set() or not sees(Internals.source(payload), request, self):
                continue
            try:
                return await payload(request)
            except _MISMATCH:  # either mismatch or depletion
                disabled.set()
            except NotImplementedError:  # matched, but nothing to respond with
                pass
        raise NotImplementedError("no reaction matches the request")

    async def _parse(self, raw_request: aiohttp.web.BaseRequest) -> kmock.Request:
        """The request as kmock reads it (a subclass may read some paths or bodies its own way)."""
        body = await raw_request.read()
        if body and not _is_text(raw_request.content_type, body):
            raise unsupported(raw_request.content_type)
        return await Internals.parse(raw_request, self._served)

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """kmock's ``RawHandler.__call__`` with the :meth:`_parse` hook, the 415 check and the trimming."""
        self._served += 1
        raw_response: aiohttp.web.StreamResponse | None = None
        request: kmock.Request | None = None
        kmock_parts = internals(self)
        try:
            request = await self._parse(raw_request)
            kmock_parts.requests.append(request)
            try:
                return await self._handle(request)
            except Internals.StreamingError as exc:  # the stream started: answer the error in it
                raw_response = exc.args[0]
                raise exc.__cause__ or exc from None
        except Exception as exc:
            if not kmock_parts.errors:
                raise
            kmock_parts.errors[-1].append(exc)
            if raw_response is None or not raw_response.prepared:
                return await self._render_error(exc)
            await self._stream_error(exc, raw_response)
            await raw_response.write_eof()
            return raw_response
        finally:
            self._trim()
            if request is not None:
                await self._after_write(request)

    def clock(self) -> float:
        """The time Events expire by (monotonic seconds)."""
        return time.monotonic()

    def _trim(self) -> None:
        """Drop what is older than :attr:`request_log` (amortised: only once the log is twice that)."""
        limit = self.request_log
        kmock_parts = internals(self)
        errors = max((len(level) for level in kmock_parts.errors), default=0)
        if limit is None or max(len(kmock_parts.requests), errors) < 2 * max(limit, 1):
            return
        _keep_last(kmock_parts.requests, limit)
        for level in kmock_parts.errors:  # kmock also keeps every error it answered (404s included)
            _keep_last(level, limit)
        for payload in kmock_parts.reactions:
            served = Internals.served(payload)
            if len(served) > limit:
                _keep_last(served, limit)

    async def _after_write(self, request: kmock.Request) -> None:
        """After a write: forget the object when it is gone (lean logs only); note an Event's write and
        expire the Events past their time or beyond the limit."""
        stored = getattr(self, "objects", None)
        if stored is None or request.action not in _WRITES:
            return
        key = _object_key(request)
        if key is None:
            return
        gone = key in stored and stored[key].deleted
        if gone and self.request_log is not None:
            del stored[key]
        if key[0].plural != "events":
            return
        if self._events is None:
            self._events = OrderedDict()
        now = self.clock()
        if gone or key not in stored:
            self._events.pop(key, None)
        else:
            self._events[key] = now
            self._events.move_to_end(key)
        await self._expire_events(now)

    async def _expire_events(self, now: float) -> None:
        events = self._events
        if not events:
            return
        limit = self.event_limit
        stored = self.objects  # type: ignore[attr-defined]  # the emulator's (see _after_write)
        while events:
            key, written = next(iter(events.items()))
            if now - written < self.event_ttl and (limit is None or len(events) <= limit):
                break
            del events[key]
            kmock_parts = internals(self)
            async with kmock_parts.store_lock:  # kmock's, around every store change
                if key not in stored or stored[key].deleted:
                    continue
                raw = stored[key].raw
                stored[key].delete()
                if self.request_log is not None:
                    del stored[key]
                await kmock_parts.bus(key[0]).put({"type": "DELETED", "object": raw})

    def _trim_object(self, request: kmock.Request) -> None:
        """Keep only the latest version (and a deletion marker) of the object this request wrote."""
        stored = getattr(self, "objects", None)
        if stored is None or request.action is None:
            return
        key = _object_key(request)
        if key is None or key not in stored:
            return
        history = stored[key].history
        keep = max((i for i, version in enumerate(history) if version is not None), default=0)
        if keep > 0:
            del history[:keep]


def _object_key(request: kmock.Request) -> tuple[Any, str | None, str] | None:
    """The store key of the object ``request`` addresses (a create names its object in the body)."""
    if request.resource is None:
        return None
    name, namespace = request.name, request.namespace
    if name is None and isinstance(request.data, dict):
        name = objects.name(request.data) or None
        namespace = namespace or objects.namespace(request.data) or None
    return None if name is None else (request.resource, namespace, name)


def _keep_last(log: list[Any], count: int) -> None:
    """Keep the last ``count`` entries of ``log`` (none for 0: ``del log[:-0]`` would keep them all)."""
    del log[: max(len(log) - count, 0)]


def _is_text(content_type: str, body: bytes) -> bool:
    if any(marker in content_type for marker in _BINARY_TYPES):
        return False
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def unsupported(content_type: str, why: str = "") -> kmock.KubernetesError:
    """kube-apiserver's 415 for a body it cannot read."""
    message = f"the body of the request was in an unknown format - accepted media types include: {_ACCEPTED}"
    return kmock.KubernetesError(
        status=415, reason="UnsupportedMediaType", message=f"{message}{'; ' + why if why else ''}"
    )


_ACCEPTED = "application/json, application/yaml, application/vnd.kubernetes.protobuf (some kinds), "
_ACCEPTED += "application/apply-patch+yaml, application/merge-patch+json, "
_ACCEPTED += "application/json-patch+json, application/strategic-merge-patch+json"
