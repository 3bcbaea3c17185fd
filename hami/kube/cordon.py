"""Compare-and-set updates of a node's ``hami.io/device-cordon`` list
(docs/annotations.md, "Node annotations"; docs/protocol.md, "Fit" check 2).

Owns one write: add and/or remove card uuids in the node annotation with a JSON patch whose ``test`` op
holds the value just read (or, when the key is absent, the enclosing object: JSON patch cannot test an
absence), so a concurrent writer's entry is never overwritten. A lost race (the API server rejects the
``test``: 422 on a real server, 500 on the embedded one; or a 409) re-reads and re-applies the same
change to the new value. An unchanged list writes nothing; an emptied list removes the key. The list's
text belongs to the codec (``encode_cordon``/``decode_cordon``); nothing here splits it. Imports
``hami.kube`` modules, ``hami.objects`` and the codec only; must not import ``hami.scheduler`` or services.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hami import objects
from hami.annotations import NODE_DEVICE_CORDON, decode_cordon, encode_cordon
from hami.kube.client import KubeError
from hami.kube.nodes import annotation_cas, get_node, json_patch_node
from hami.kube.pods import pointer
from hami.kube.protocol import KubeApi

#: JSON pointer of the cordon annotation (``/`` in the key escaped as ``~1``).
CORDON_POINTER = pointer("metadata", "annotations", NODE_DEVICE_CORDON)
#: How many lost compare-and-set races to absorb before giving up.
CAS_ATTEMPTS = 5
#: Answers that mean "the object changed under us": retry on a fresh read. Anything else (403, ...) is
#: the caller's problem and is raised as is.
_LOST_RACE = frozenset({409, 422, 500})


@dataclass(frozen=True, slots=True, kw_only=True)
class CordonUpdate:
    """The cordon list of ``node`` as read just before the (possibly skipped) write, and as left."""

    node: str
    before: frozenset[str]
    after: frozenset[str]

    @property
    def written(self) -> bool:
        return self.before != self.after


def cordon_of(node: Mapping[str, Any]) -> frozenset[str]:
    """The card uuids a Node object's annotation cordons."""
    return decode_cordon(objects.annotations(node).get(NODE_DEVICE_CORDON))


async def update_device_cordon(
    api: KubeApi,
    name: str,
    *,
    add: Iterable[str] = (),
    remove: Iterable[str] = (),
    node: Mapping[str, Any] | None = None,
) -> CordonUpdate:
    """Cordon ``add`` and uncordon ``remove`` on node ``name``; entries of other writers are kept.

    ``node`` is an already-read copy of the Node to start from (saves a GET; a stale copy only costs a
    retry). Raises :class:`~hami.kube.client.NotFound` when the node is gone and :class:`KubeError` for
    other failures, or after :data:`CAS_ATTEMPTS` lost races in a row.
    """
    adding, removing = frozenset(add), frozenset(remove)
    last: KubeError | None = None
    for _ in range(CAS_ATTEMPTS):
        obj = node if node is not None else await get_node(api, name)
        node = None  # every retry reads afresh
        metadata = objects.meta(obj)  # as stored: the patch's test op echoes it
        current = objects.annotations(obj).get(NODE_DEVICE_CORDON)
        before = decode_cordon(current)
        after = (before | adding) - removing
        if after == before:
            return CordonUpdate(node=name, before=before, after=after)
        value = encode_cordon(after) if after else None  # current is None only when adding: value set
        try:
            await json_patch_node(api, name, annotation_cas(metadata, NODE_DEVICE_CORDON, current, value))
        except KubeError as exc:
            if exc.status not in _LOST_RACE:
                raise
            last = exc
            continue
        return CordonUpdate(node=name, before=before, after=after)
    raise KubeError(
        0,
        "CordonConflict",
        f"node {name}: {NODE_DEVICE_CORDON} changed under us {CAS_ATTEMPTS} times: {last}",
    )
