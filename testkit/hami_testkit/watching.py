"""Watch streams of the embedded apiserver, as kube-apiserver serves them to kubectl and client-go.

Owns :func:`watch_stream`, the JSON lines of one watch request: without a ``resourceVersion`` every
matching object first as ADDED, with one only what changed after it; then kmock's per-resource event
bus, filtered by namespace, name and selector (an object that starts or stops matching is sent as ADDED
or DELETED, an event that raced the initial state is not sent twice); each object as a one-row
``meta.k8s.io/v1`` Table when the client asked for Tables; the end after ``timeoutSeconds``; and with
``sendInitialEvents=true`` (client-go's streaming list) the BOOKMARK that ends the initial events.
Simulation only. Must not import ``hami.kube``, ``webhook`` or ``nodeagent``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import kmock

from hami import objects
from hami_testkit.kmock_seam import internals
from hami_testkit.selectors import Selector
from hami_testkit.tables import as_table

JsonDict = dict[str, Any]


def revision_of(obj: Mapping[str, Any]) -> int:
    value = objects.resource_version(obj)
    return int(value) if value.isdigit() else 0


async def watch_stream(
    k: kmock.KubernetesEmulator,
    store: Any,
    request: kmock.Request,
    chosen: Selector,
    table: bool,
    clock: Callable[[], datetime.datetime],
) -> AsyncIterator[bytes]:
    """The event stream of one watch request (see the module docstring)."""
    yield b""  # headers out now, even if nothing happens
    assert request.resource is not None
    plural = str(request.resource.plural)
    since_text = request.params.get("resourceVersion") or ""
    since = int(since_text) if since_text.isdigit() and since_text != "0" else None
    timeout = float(request.params["timeoutSeconds"]) if request.params.get("timeoutSeconds") else None
    include = request.params.get("includeObject", "Metadata")
    initial_events = request.params.get("sendInitialEvents") == "true"
    if initial_events:
        since = None  # a streaming list: the current state first, whatever resourceVersion says
    first = [True]

    def line(kind: str, obj: JsonDict) -> bytes:
        shown: JsonDict = obj
        if table:
            shown = as_table(plural, [obj], clock(), include_object=include, columns=first[0])
            shown["metadata"]["resourceVersion"] = str(revision_of(obj))
            first[0] = False
        return json.dumps({"type": kind, "object": shown}).encode() + b"\n"

    def key(obj: Mapping[str, Any]) -> tuple[str, str]:
        return objects.namespace(obj), objects.name(obj)

    def in_scope(obj: Mapping[str, Any]) -> bool:
        namespace, name = key(obj)
        return (request.namespace is None or namespace == request.namespace) and (
            request.name is None or name == request.name
        )

    bus = internals(k).bus(request.resource)  # kmock's per-resource event bus (its own watch streams it)
    marker = await bus.mark()
    sent: dict[tuple[str, str], int] = {}  # visible objects -> the revision last sent
    try:
        for obj in store.objects(request):
            if chosen.matches(obj):
                sent[key(obj)] = revision_of(obj)
                if since is None or revision_of(obj) > since:
                    yield line("ADDED", obj)
        if initial_events:  # the bookmark that ends the initial events (client-go's WatchList)
            group = request.resource.group
            bookmark = {
                "kind": store.kind(request),
                "apiVersion": "v1" if not group else f"{group}/{request.resource.version}",
                "metadata": {
                    "resourceVersion": store.revision(),
                    "annotations": {"k8s.io/initial-events-end": "true"},
                },
            }
            yield json.dumps({"type": "BOOKMARK", "object": bookmark}).encode() + b"\n"
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                async for event in bus.stream(since=marker):
                    obj = event.get("object") or {}
                    if not in_scope(obj):
                        continue
                    ident, kind = key(obj), str(event.get("type"))
                    visible, matches = ident in sent, chosen.matches(obj)
                    if kind == "DELETED" or (visible and not matches):
                        if visible:
                            del sent[ident]
                            yield line("DELETED", obj)
                        continue
                    if not matches or (visible and revision_of(obj) and revision_of(obj) <= sent[ident]):
                        continue  # not ours, or already sent (an event raced the initial state)
                    sent[ident] = revision_of(obj)
                    yield line("MODIFIED" if visible else "ADDED", obj)
    finally:
        await bus.unmark(marker)
