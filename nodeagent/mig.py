"""Dynamic MIG in Allocate: make the exact instances the scheduler booked and record them on the pod.

Owns the Allocate step for a MIG-mode node (docs/protocol.md, "Allocate"; docs/node-agent.md, "Dynamic MIG"):
each popped (container, device) must have its reservation in ``hami.io/vgpu-mig-allocations``; the backend is
asked for a GPU instance of that profile at exactly that placement (with one compute instance spanning it),
reusing an existing instance with the same profile and placement; ``migUUID``, ``gpuInstanceID`` and
``computeInstanceID`` are merge-patched back into the annotation; the container sees
``NVIDIA_VISIBLE_DEVICES`` = its MIG UUIDs and no HAMi-core limits.

Leftovers are reclaimed lazily, never by a background sweep: an instance overlapping the booked slices
is destroyed only when no live pod on this node records its MIG UUID (``hami.annotations.holding``
without the grant: any pod bound here but Succeeded/Failed, deleting pods included); an instance a
live pod records is a conflict and the Allocate fails. The agent owns every instance on a MIG-mode
card, so an instance nobody records (a deleted pod's, a half-made one, one made by hand) counts as
left over. Imports the codec, ``hami.kube`` and the
backend protocol; must not import grpc or pynvml.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami.annotations import (
    POD_MIG_ALLOCATIONS,
    encode_mig_allocations,
    read_pod_mig_allocations,
)
from hami.annotations.holding import holding
from hami.core.model import Grant, MigAllocation
from hami.kube.pods import list_pods, patch_pod
from hami.kube.protocol import KubeApi
from hami.objects import pod_key
from nodeagent.allocate_rules import AllocationError, ContainerAnswer, container_names
from nodeagent.backends.base import Backend, BackendError, MigBackend, MigInstance
from nodeagent.podcache import NodePods

log = logging.getLogger(__name__)

#: Who records a MIG instance: (namespace/name, container index, device index).
Owner = tuple[str, int, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class Claims:
    """The MIG instances live pods record, and the live pods whose record cannot be read."""

    owners: Mapping[str, Owner]  # MIG UUID -> its recording entry
    unreadable: tuple[str, ...] = ()  # "ns/name: reason"; their instances are unknown, so none is spare

    def with_owner(self, mig_uuid: str, owner: Owner) -> Claims:
        return dataclasses.replace(self, owners={**self.owners, mig_uuid: owner})


def live_claims(pods: Iterable[Mapping[str, Any]], node: str) -> Claims:
    """Claims of every pod that still holds what it records on ``node``: the shared rule
    (``hami.annotations.holding``) without the grant, since an instance is in use while the pod's
    containers may run, whatever its grant annotations say now (not Succeeded/Failed, bound here)."""
    owners: dict[str, Owner] = {}
    unreadable: list[str] = []
    for pod in pods:
        if holding(pod, grant_required=False).node != node:
            continue
        namespace, name = pod_key(pod)
        try:
            bookings = read_pod_mig_allocations(pod)
        except ValueError as exc:
            unreadable.append(f"{namespace}/{name}: {exc}")
            continue
        for booking in bookings:
            if booking.mig_uuid is not None:
                owners[booking.mig_uuid] = (
                    f"{namespace}/{name}",
                    booking.container_index,
                    booking.device_index,
                )
    return Claims(owners=owners, unreadable=tuple(unreadable))


def _describe(instance: MigInstance) -> str:
    end = instance.start + instance.size
    name = instance.mig_uuid or "without a compute instance"
    return f"{instance.profile} GPU instance {instance.gpu_instance_id} at [{instance.start}, {end}) ({name})"


def ensure_instance(
    backend: MigBackend, booking: MigAllocation, *, owner: Owner, claims: Claims
) -> MigInstance:
    """The instance for one booking: reused when one with its profile and placement is spare (or already
    this entry's), else created after destroying the spare instances in its way. Blocking.

    Raises :class:`AllocationError` when a live pod's instance is in the way, :class:`BackendError`
    when the hardware refuses.
    """
    gpu, start, size = booking.gpu_uuid, booking.placement.start, booking.placement.size
    instances = backend.mig_instances(gpu)

    def spare_or_mine(instance: MigInstance) -> bool:
        return instance.mig_uuid is not None and claims.owners.get(instance.mig_uuid, owner) == owner

    exact = [
        i
        for i in instances
        if (i.profile, i.start, i.size) == (booking.profile, start, size) and spare_or_mine(i)
    ]
    if exact:  # prefer the instance this entry already records (a retried Allocate)
        return next((i for i in exact if i.mig_uuid == booking.mig_uuid), exact[0])
    blocking = [i for i in instances if i.overlaps(start, size)]
    for instance in blocking:
        holder = claims.owners.get(instance.mig_uuid) if instance.mig_uuid else None
        occupied = f"the placement is occupied by {_describe(instance)}"
        if holder is not None and holder != owner:
            raise AllocationError(
                f"{occupied}, which pod {holder[0]} (container {holder[1]}, device {holder[2]}) still uses"
            )
        if claims.unreadable:
            raise AllocationError(
                f"{occupied}, which may be in use: cannot read {POD_MIG_ALLOCATIONS} of "
                f"{'; '.join(claims.unreadable)}"
            )
    for instance in blocking:
        log.info("card %s: destroying left-over MIG %s", gpu, _describe(instance))
        backend.destroy_mig_instance(gpu, instance.gpu_instance_id)
    return backend.create_mig_instance(gpu, booking.profile, start, size)


async def allocate_mig(
    *,
    api: KubeApi,
    backend: Backend | None,
    node: str,
    pod: Mapping[str, Any],
    served: Sequence[tuple[int, tuple[Grant, ...]]],
    pods: NodePods | None = None,
) -> list[ContainerAnswer]:
    """Answers for the popped entries ``served`` = (container index, its grants) of a MIG-mode pod;
    the instances exist and are recorded on the pod when this returns. The claims are read from one
    fresh list (``pods.listed()``, the node's pods otherwise): an instance is reused or destroyed on the
    API server's state now, never on the pod cache's (which may not show an instance recorded moments
    ago yet)."""
    namespace, name = pod_key(pod)
    where = f"pod {namespace}/{name} on node {node}"
    if not isinstance(backend, MigBackend):
        which = "there is none" if backend is None else f"{backend.name} cannot"
        raise AllocationError(
            f"{where}: dynamic MIG needs a card backend that creates MIG instances; {which}"
        )
    bookings = list(read_pod_mig_allocations(pod))  # AnnotationError (a ValueError) names key and text
    position = {(b.container_index, b.device_index): k for k, b in enumerate(bookings)}
    listed = (await pods.listed()).pods if pods is not None else await list_pods(api, node_name=node)
    claims = live_claims(listed, node)
    names = container_names(pod)
    answers = []
    for index, grants in served:
        container = names[index] if index < len(names) else f"#{index}"
        mig_uuids: list[str] = []
        for device, grant in enumerate(grants):
            k = position.get((index, device))
            if k is None or bookings[k].gpu_uuid != grant.uuid:
                found = "none" if k is None else f"one on card {bookings[k].gpu_uuid}"
                raise AllocationError(
                    f"{where}: container {container} device {device} (card {grant.uuid}) has no MIG "
                    f"reservation in {POD_MIG_ALLOCATIONS} (found {found})"
                )
            owner: Owner = (f"{namespace}/{name}", index, device)
            booking = bookings[k]
            try:
                instance = await asyncio.to_thread(
                    ensure_instance, backend, booking, owner=owner, claims=claims
                )
            except (AllocationError, BackendError) as exc:
                raise AllocationError(
                    f"{where}: container {container} device {device}: MIG {booking.profile} at "
                    f"[{booking.placement.start}, {booking.placement.start + booking.placement.size}) "
                    f"on card {grant.uuid}: {exc}"
                ) from exc
            if instance.mig_uuid is None or instance.compute_instance_id is None:
                raise AllocationError(f"{where}: the backend returned {_describe(instance)}")
            claims = claims.with_owner(instance.mig_uuid, owner)
            bookings[k] = dataclasses.replace(
                booking,
                mig_uuid=instance.mig_uuid,
                gpu_instance_id=instance.gpu_instance_id,
                compute_instance_id=instance.compute_instance_id,
            )
            mig_uuids.append(instance.mig_uuid)
        uuids = tuple(dict.fromkeys(mig_uuids))
        envs = {"NVIDIA_VISIBLE_DEVICES": ",".join(uuids)}  # no HAMi-core limits: MIG isolates
        answers.append(ContainerAnswer(container=container, uuids=uuids, envs=envs))
    await patch_pod(api, namespace, name, annotations={POD_MIG_ALLOCATIONS: encode_mig_allocations(bookings)})
    return answers
