"""Kubernetes Events (``v1``) recorded on Pods and Nodes: one at a time, or aggregated like kube's recorder.

Owns: building and creating one Event with an explicit unique name (``generateName`` is not honoured
by every API server, and two events must never collide); and :class:`EventRecorder`, which follows
repeated Events about one pod the way client-go's event recorder aggregates them: the same pod (uid),
reason and type make ONE Event whose ``count``, ``lastTimestamp`` and message are patched as more
occurrences come. Bounded: the first occurrence is written at once, later ones at most once per
``interval`` per pod (a final :meth:`EventRecorder.flush` writes what is left), at most ``max_objects``
pods are followed at a time (occurrences about further pods are dropped, never queued, until a followed
pod has been quiet for ``forget_after`` seconds), and all API calls share one token bucket (``rate`` per
second, ``burst``). Checked: before its first write about a
pod the recorder reads it from the API server and writes nothing unless a pod with that namespace, name
and uid exists and ``accept(pod)`` holds; the Event goes into that pod's namespace and names the pod as
read. Imports ``hami.kube.client``, ``hami.kube.paths``, ``hami.kube.protocol`` and ``hami.objects``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hami import objects
from hami.kube import paths
from hami.kube.client import KubeError, NotFound, call_json
from hami.kube.protocol import KubeApi

logger = logging.getLogger(__name__)

MERGE_PATCH = paths.MERGE_PATCH
MAX_MESSAGE = 1024


def _stamp(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def build_event(
    *,
    involved: Mapping[str, Any],
    reason: str,
    message: str,
    type: str = "Normal",
    component: str,
    now: datetime.datetime | None = None,
    first: datetime.datetime | None = None,
    count: int = 1,
) -> dict[str, Any]:
    """The Event body for ``involved`` (a raw Pod or Node dict); ``first`` defaults to ``now``."""
    name, namespace, uid = objects.name(involved), objects.namespace(involved), objects.uid(involved)
    last = now or _utc_now()
    # list items carry no kind; namespaced objects here are Pods, cluster-scoped ones Nodes
    kind = str(involved.get("kind") or ("Pod" if namespace else "Node"))
    reference: dict[str, Any] = {
        "apiVersion": str(involved.get("apiVersion") or "v1"),
        "kind": kind,
        "name": name,
    }
    if namespace:
        reference["namespace"] = namespace
    if uid:
        reference["uid"] = uid
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.{uuid.uuid4().hex[:16]}", "namespace": namespace or "default"},
        "involvedObject": reference,
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "type": type,
        "source": {"component": component},
        "reportingComponent": component,
        "firstTimestamp": _stamp(first or last),
        "lastTimestamp": _stamp(last),
        "count": count,
    }


async def record_event(
    api: KubeApi,
    *,
    involved: Mapping[str, Any],
    reason: str,
    message: str,
    type: str = "Normal",
    component: str,
) -> None:
    """Create one Event about ``involved``; Node events go to the ``default`` namespace."""
    body = build_event(involved=involved, reason=reason, message=message, type=type, component=component)
    where = {"namespace": body["metadata"]["namespace"]}
    await call_json(api, "POST", paths.EVENTS, params=where, body=body)


# --------------------------------------------------------------------------------- the recorder
SeriesKey = tuple[str, str, str, str, str]  # namespace, name, uid, reason, type


@dataclass(slots=True, kw_only=True)
class _Series:
    """Occurrences of one (pod, reason, type) and what the API server has of them."""

    namespace: str
    name: str
    uid: str
    reason: str
    type: str
    accept: Callable[[Mapping[str, Any]], bool]
    first: datetime.datetime
    last: datetime.datetime
    message: str = ""
    count: int = 0
    written: int = 0  # the count the stored Event has
    event: str | None = None  # the stored Event's name
    involved: dict[str, Any] | None = None  # the pod as read, once checked
    refused: bool = False  # the check failed: never written
    due: float = 0.0  # loop time of the next allowed write
    seen: float = 0.0  # loop time of the last occurrence
    task: asyncio.Task[None] | None = None

    @property
    def dirty(self) -> bool:
        return not self.refused and self.count > self.written


class _Bucket:
    """A token bucket on the loop clock: ``rate`` calls per second, at most ``burst`` at once."""

    def __init__(self, rate: float, burst: int) -> None:
        self._rate, self._burst = rate, float(burst)
        self._tokens, self._stamp = float(burst), -1.0

    async def take(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            if self._stamp >= 0:
                self._tokens = min(self._burst, self._tokens + (now - self._stamp) * self._rate)
            self._stamp = now
            if self._tokens >= 1:
                self._tokens -= 1
                return
            await asyncio.sleep((1 - self._tokens) / self._rate)  # pacing, not synchronisation


class EventRecorder:
    """Aggregated, bounded, checked Events about pods (module docstring). Runs on one event loop."""

    def __init__(
        self,
        api: KubeApi,
        *,
        component: str,
        clock: Callable[[], datetime.datetime] = _utc_now,
        interval: float = 30.0,
        max_objects: int = 1024,
        forget_after: float = 600.0,
        rate: float = 5.0,
        burst: int = 20,
        concurrency: int = 4,
    ) -> None:
        self._api = api
        self._component = component
        self._clock = clock
        self._interval = interval
        self._max_objects = max_objects
        self._forget_after = forget_after
        self._bucket = _Bucket(rate, burst)
        self._slots = asyncio.Semaphore(concurrency)
        self._series: dict[SeriesKey, _Series] = {}
        self._hurry = asyncio.Event()  # set by flush: write now, whatever the interval
        self.dropped = 0  # occurrences not followed because max_objects pods were followed already

    def record(
        self,
        pod: Mapping[str, Any],
        *,
        reason: str,
        message: str,
        type: str = "Warning",
        accept: Callable[[Mapping[str, Any]], bool] = lambda pod: True,
    ) -> bool:
        """Count one occurrence about ``pod`` (as the caller names it); never waits. False: not followed."""
        namespace, name, uid = objects.namespace(pod), objects.name(pod), objects.uid(pod)
        if not (namespace and name and uid):
            return False  # not a stored pod: nothing to check it against
        key = (namespace, name, uid, reason, type)
        series = self._series.pop(key, None)  # re-inserted below: the dict's order is least recent first
        now = self._clock()
        if series is None:
            if not self._make_room():
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 1000 == 0:
                    logger.warning("%d %s events dropped: %d pods followed", self.dropped, reason, len(self))
                return False
            series = _Series(
                namespace=namespace,
                name=name,
                uid=uid,
                reason=reason,
                type=type,
                accept=accept,
                first=now,
                last=now,
            )
        self._series[key] = series
        series.seen = asyncio.get_running_loop().time()
        if series.refused:
            return False
        series.count += 1
        series.last = now
        series.message = message
        if series.task is None:
            series.task = asyncio.get_running_loop().create_task(self._follow(series))
        return True

    def _make_room(self) -> bool:
        """Whether one more pod may be followed, forgetting the least recent quiet one if need be."""
        if len(self._series) < self._max_objects:
            return True
        quiet_since = asyncio.get_running_loop().time() - self._forget_after
        for key, series in self._series.items():  # least recently recorded first
            if series.task is None and not series.dirty and (series.refused or series.seen <= quiet_since):
                del self._series[key]
                return True
        return False

    async def _follow(self, series: _Series) -> None:
        """Write ``series`` whenever it has unwritten occurrences and its interval allows."""
        loop = asyncio.get_running_loop()
        try:
            while series.dirty:
                wait = series.due - loop.time()
                if wait > 0 and not self._hurry.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._hurry.wait(), wait)
                async with self._slots:
                    await self._write(series)
                series.due = loop.time() + self._interval
        except KubeError as exc:
            series.due = loop.time() + self._interval
            logger.warning(
                "%s event on pod %s/%s failed: %s", series.reason, series.namespace, series.name, exc
            )
        finally:
            series.task = None

    async def _write(self, series: _Series) -> None:
        if series.involved is None:
            await self._bucket.take()
            try:
                where = {"namespace": series.namespace, "name": series.name}
                pod = await call_json(self._api, "GET", paths.POD, params=where)
            except NotFound:
                pod = None
            if not pod or objects.uid(pod) != series.uid or not series.accept(pod):
                series.refused = True
                return
            series.involved = pod
        count, last, message = series.count, series.last, series.message[:MAX_MESSAGE]
        await self._bucket.take()
        if series.event is not None:
            patch = {"count": count, "lastTimestamp": _stamp(last), "message": message}
            try:
                await call_json(
                    self._api,
                    "PATCH",
                    paths.EVENT,
                    params={"namespace": series.namespace, "name": series.event},
                    body=patch,
                    content_type=MERGE_PATCH,
                )
                series.written = count
                return
            except NotFound:  # expired (the API server's event TTL) or deleted: write it anew
                series.event = None
                await self._bucket.take()
        body = build_event(
            involved=series.involved,
            reason=series.reason,
            message=message,
            type=series.type,
            component=self._component,
            now=last,
            first=series.first,
            count=count,
        )
        await call_json(self._api, "POST", paths.EVENTS, params={"namespace": series.namespace}, body=body)
        series.event = body["metadata"]["name"]
        series.written = count

    async def flush(self, seconds: float = 10.0) -> None:
        """Write every unwritten occurrence now (at most ``seconds``; what is left is given up)."""
        self._hurry.set()
        try:
            for series in self._series.values():
                if series.dirty and series.task is None:
                    series.task = asyncio.get_running_loop().create_task(self._follow(series))
            tasks = [s.task for s in self._series.values() if s.task is not None]
            if tasks:
                _, pending = await asyncio.wait(tasks, timeout=seconds)
                for task in pending:
                    task.cancel()
        finally:
            self._hurry.clear()

    def __len__(self) -> int:
        return len(self._series)
