"""List + watch of Nodes, Pods, ResourceQuotas or PodDisruptionBudgets (all namespaces) in a thread
that feeds an asyncio loop.

Owns the informer-like loop: list (raw JSON) and hand it to the loop, then watch from the list's
resourceVersion and hand every event over; when a watch ends (server timeout, client read
timeout, dropped connection) watch again from the last resourceVersion seen; on ``410 Gone`` (an
HTTP 410 or an ``ERROR`` event with code 410) list again; on other errors wait ``backoff`` seconds and
list again. Callbacks run on the loop (``call_soon_threadsafe``), never in the thread. Some API
servers re-send every object as ``ADDED`` on each reconnect: consumers must treat events as
idempotent upserts. Every restart is reported to ``on_restart`` with its cause (``ended``: the server
closed the stream; ``dropped``: a read timeout or a broken connection; ``gone_410``: relist after 410;
``error``: another failed list or watch, retried after ``backoff``), so the caller can count them
without this module knowing about metrics. Stopping is not a restart.

Dispatch, on the loop, one object at a time (like client-go's informer): each listed object goes to
``on_event("ADDED", obj)``, then ``on_list(applied)`` says the list is complete (``applied``: the listed
objects that were handled; the consumer forgets every other object and counts itself synced; the
garbage collector is paused, :class:`CollectorPause`, while a list is decoded and dispatched); each watch
event goes to ``on_event``. ``on_listing()``, when given, is delivered before each list request is sent,
so it runs on the loop before anything the loop does after the API server took that list (what the
consumer did since then may be newer than the list: the scheduler keeps the bookings bind made since,
docs/scheduler.md, "The live view of the cluster"). An exception from the handler for ONE object never
aborts the list or the watch: the object is skipped (a listed one is left out of ``applied``), logged
with its kind, name and reason, counted in ``skipped``, and reported to ``on_skip(kind, obj, error)``
(the caller records a Warning Event on it) once per object and reason until the object is handled well
again or deleted. The list and the watch are plain GETs of the kind's path (``hami.kube.paths``) through
:func:`hami.kube.client.send` (no generated API class), the watch read line by line from the raw response.
Imports ``hami.kube.client``, ``hami.kube.paths``, ``hami.kube.protocol``, ``hami.objects`` and
``urllib3``; nothing above ``hami.kube``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any, Literal

import urllib3

from hami import objects
from hami.kube import paths
from hami.kube.client import Gone, KubeError, QueryValue, error_from, send, timeout_of
from hami.kube.protocol import KubeApi

logger = logging.getLogger(__name__)

Kind = Literal["nodes", "pods", "resourcequotas", "poddisruptionbudgets"]
ListCallback = Callable[[list[dict[str, Any]]], None]
EventCallback = Callable[[str, dict[str, Any]], None]
ErrorCallback = Callable[[KubeError], None]
RestartCallback = Callable[[str], None]
SkipCallback = Callable[[str, dict[str, Any], Exception], None]

#: Why a list/watch started over (the values handed to ``on_restart``).
ENDED = "ended"
DROPPED = "dropped"
GONE = "gone_410"
ERROR = "error"
RESTART_CAUSES = (ENDED, DROPPED, GONE, ERROR)

#: The path that lists (and, with ``watch=true``, watches) each kind cluster-wide.
PATHS: dict[str, str] = {
    "nodes": paths.NODES,
    "pods": paths.PODS,
    "resourcequotas": paths.RESOURCE_QUOTAS,
    "poddisruptionbudgets": paths.POD_DISRUPTION_BUDGETS,
}
#: The object kind of each resource (list items and watch objects may carry none), for logs and Events.
OBJECT_KINDS: dict[str, str] = {
    "nodes": "Node",
    "pods": "Pod",
    "resourcequotas": "ResourceQuota",
    "poddisruptionbudgets": "PodDisruptionBudget",
}
ADDED = "ADDED"
#: Longest error text put in a log line or handed to ``on_skip`` callers' messages.
MAX_REASON = 500


class CollectorPause:
    """Automatic garbage collection off while any holder is inside (counted: the lists of several
    watchers overlap), back on when the last one leaves, unless it was off before the first came.

    A list of 50,000 pods decodes to millions of containers, and booking it creates hundreds of
    thousands of objects more: with the collector on, each full collection walked every object alive so
    far, again and again as the heap grew (a quarter of the scheduler's CPU to be ready). Decoding JSON
    and booking a list make no reference cycles the collector would free sooner; one made meanwhile
    (anywhere in the process) is collected after."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._holders = 0
        self._resume = False

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        with self._guard:
            if self._holders == 0:
                self._resume = gc.isenabled()
                gc.disable()
            self._holders += 1
        try:
            yield
        finally:
            with self._guard:
                self._holders -= 1
                if self._holders == 0 and self._resume:
                    gc.enable()


#: The one pause every list of this process shares.
COLLECTOR_PAUSE = CollectorPause()


def _lines(response: Any) -> Iterator[bytes]:
    """Newline-delimited chunks of a streamed response body."""
    buffer = b""
    for chunk in response.stream(amt=None, decode_content=False):
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        yield from (line for line in complete if line.strip())
    if buffer.strip():
        yield buffer


class ListWatcher:
    """Keeps one resource kind flowing into ``on_list`` / ``on_event`` until :meth:`stop`."""

    def __init__(
        self,
        api: KubeApi,
        kind: Kind,
        *,
        loop: asyncio.AbstractEventLoop,
        on_list: ListCallback,
        on_event: EventCallback,
        on_error: ErrorCallback | None = None,
        on_restart: RestartCallback | None = None,
        on_skip: SkipCallback | None = None,
        on_listing: Callable[[], None] | None = None,
        watch_seconds: int = 300,
        backoff: float = 1.0,
        field_selector: str | None = None,
    ) -> None:
        self._api = api
        self._selector = field_selector or None
        self._kind = kind
        self._loop = loop
        self._on_list = on_list
        self._on_event = on_event
        self._on_error = on_error
        self._on_restart = on_restart
        self._on_skip = on_skip
        self._on_listing = on_listing
        self._watch_seconds = watch_seconds
        self._backoff = backoff
        self._stopping = threading.Event()
        self._guard = threading.Lock()
        self._response: Any = None
        self._thread = threading.Thread(target=self._run, name=f"hami-watch-{kind}", daemon=True)
        #: how many watch requests were opened (each reconnect counts); for health and tests
        self.watches_opened = 0
        self.lists_done = 0
        #: objects whose handler failed (each failure counts); read on the loop
        self.skipped = 0
        self._reported: dict[tuple[str, str], str] = {}  # (namespace, name) -> reason last reported

    def start(self) -> None:
        # No generated API class is used (hami.kube.client.send): nothing heavy is imported by the first
        # request, in the watch thread, against the loop it feeds (issue 26: the first use of CoreV1Api
        # imported its module there, ~1 s of CPU holding the GIL in 5 ms slices as the loop began to serve).
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread: interrupt the open stream and wait for the thread to end."""
        with self._guard:  # paired with the check in _watch: no stream can open unnoticed
            self._stopping.set()
            response = self._response
        if response is not None:
            # already released or closed: the thread is leaving anyway
            with contextlib.suppress(ValueError, RuntimeError, OSError):
                response.shutdown()
        self._thread.join(timeout)

    # ------------------------------------------------------------------------- dispatch (on the loop)

    def _dispatch_list(self, items: list[dict[str, Any]]) -> None:
        with COLLECTOR_PAUSE.held():
            applied = [obj for obj in items if self._apply(ADDED, obj)]  # objects only: objects.items
            try:
                self._on_list(applied)
            except Exception:
                logger.exception("list of %s: the list handler failed", self._kind)
            # our references to the listed objects go before the collector is back: its first collection
            # then walks what the handlers kept (the scheduler's workload keeps its pods until it has read
            # them, a few seconds after the first list), not every object listed
            del applied
            items.clear()

    def _dispatch_event(self, kind: str, obj: dict[str, Any]) -> None:
        self._apply(kind, obj)

    def _apply(self, kind: str, obj: dict[str, Any]) -> bool:
        """Hand one object to ``on_event``; True when it was handled, False when it was skipped."""
        key = (objects.namespace(obj), objects.name(obj))
        try:
            self._on_event(kind, obj)
        except Exception as exc:
            self._skip(key, obj, exc)
            return False
        if self._reported:  # handled well (or deleted): a later failure is reported again
            self._reported.pop(key, None)
        return True

    def _skip(self, key: tuple[str, str], obj: dict[str, Any], exc: Exception) -> None:
        self.skipped += 1
        kind = OBJECT_KINDS[self._kind]
        reason = f"{type(exc).__name__}: {exc}"[:MAX_REASON]
        name = "/".join(part for part in key if part)
        if self._reported.get(key) == reason:
            logger.debug("%s %s skipped again: %s", kind, name, reason)
            return
        self._reported[key] = reason
        logger.warning("%s %s skipped: %s", kind, name, reason)
        if self._on_skip is not None:
            try:
                self._on_skip(kind, obj, exc)
            except Exception:
                logger.exception("%s %s: reporting the skip failed", kind, name)

    # ------------------------------------------------------------------------------------- thread

    def _deliver(self, callback: Callable[..., None], *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self._stopping.set()

    def _restarted(self, cause: str) -> None:
        if self._on_restart is not None and not self._stopping.is_set():
            self._deliver(self._on_restart, cause)

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                version = self._list()
                while not self._stopping.is_set():
                    version = self._watch(version)
            except Gone:
                logger.info("watch of %s: resourceVersion too old, listing again", self._kind)
                self._restarted(GONE)
            except KubeError as exc:
                if self._stopping.is_set():
                    return
                logger.warning("list/watch of %s failed: %s", self._kind, exc)
                self._restarted(ERROR)
                if self._on_error is not None:
                    self._deliver(self._on_error, exc)
                self._stopping.wait(self._backoff)

    def _list(self) -> str:
        if self._on_listing is not None:  # on the loop before the request leaves: before the list is taken
            self._deliver(self._on_listing)
        try:
            query = {"fieldSelector": self._selector}
            response = send(self._api, "GET", PATHS[self._kind], query=query, timeout=timeout_of(self._api))
            with COLLECTOR_PAUSE.held():
                body = json.loads(response.data or b"{}")
        except Exception as exc:
            raise error_from(exc) from exc
        self.lists_done += 1
        listed, version = objects.items(body), objects.resource_version(body)
        del body, response  # the listed objects are the loop's from here (it drops them when booked)
        self._deliver(self._dispatch_list, listed)
        return version

    def _watch(self, version: str) -> str:
        """One watch request; returns the last resourceVersion seen when the stream ends."""
        try:
            query: dict[str, QueryValue] = {  # in the generated list method's order
                "allowWatchBookmarks": True,
                "fieldSelector": self._selector,
                "resourceVersion": version or None,
                "timeoutSeconds": self._watch_seconds,
                "watch": True,
            }
            response = send(
                self._api,
                "GET",
                PATHS[self._kind],
                query=query,
                timeout=(timeout_of(self._api), self._watch_seconds + 30),
            )
        except Exception as exc:
            raise error_from(exc) from exc
        self.watches_opened += 1
        with self._guard:
            if self._stopping.is_set():
                response.close()
                response.release_conn()
                return version
            self._response = response
        try:
            for line in _lines(response):
                version = self._handle(line, version)
            self._restarted(ENDED)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            # read timeout, dropped connection or our own shutdown(): the watch simply ended
            logger.debug("watch of %s ended: %s", self._kind, exc)
            self._restarted(DROPPED)
        finally:
            with self._guard:
                self._response = None
            response.close()  # never reuse a connection whose stream was cut short
            response.release_conn()
        return version

    def _handle(self, line: bytes, version: str) -> str:
        try:
            event = json.loads(line)
            kind = str(event["type"])
            obj = event["object"]
        except (ValueError, KeyError, TypeError):
            logger.warning("watch of %s: skipping an unreadable event line %r", self._kind, line[:200])
            return version
        if kind == "ERROR":
            code = int(obj.get("code") or 0) if isinstance(obj, dict) else 0
            if code == 410:
                raise Gone(410, str(obj.get("reason") or "Gone"), str(obj.get("message") or ""))
            raise KubeError(code, "WatchError", json.dumps(obj)[:500])
        if not isinstance(obj, dict):
            return version
        version = objects.resource_version(obj) or version
        if kind != "BOOKMARK":
            self._deliver(self._dispatch_event, kind, obj)
        return version
