"""The booking ledger: the allocations bind decided that the watch does not show yet.

Owns :class:`BookingLedger`. Bind decides on the live view and books the allocation at once (before any
API write), so a racing bind sees it. A booking wins over what the watch says about that pod until the
watch shows the same allocation (:meth:`BookingLedger.confirm`), the bind fails
(:meth:`BookingLedger.cancel`) or the pod is deleted (:meth:`BookingLedger.forget`). Each booking
carries when it was made (a serial), so a pod list taken before it (:meth:`BookingLedger.mark`) does not
forget it (:meth:`BookingLedger.booked_since`). Which record a pod
counts with is decided by the composition, :class:`~hami.scheduler.snapshot.Snapshot`. Pure bookkeeping:
no I/O, no clock; must not import the Kubernetes client, aiohttp or asyncio.
"""

from __future__ import annotations

from hami.scheduler.podrecords import PodKey, PodRecord


class BookingLedger:
    """Per pod key, the record bind booked; every method runs on the event loop."""

    def __init__(self) -> None:
        self._bookings: dict[PodKey, PodRecord] = {}
        self._serials: dict[PodKey, int] = {}  # when each booking was made, in booking order
        self._serial = 0

    def book(self, key: PodKey, record: PodRecord) -> None:
        self._serial += 1
        self._bookings[key] = record
        self._serials[key] = self._serial

    def mark(self) -> int:
        """A mark of now: :meth:`booked_since` it names the bookings made after this call."""
        return self._serial

    def booked_since(self, mark: int) -> set[PodKey]:
        return {key for key, serial in self._serials.items() if serial > mark}

    def cancel(self, key: PodKey) -> bool:
        """Drop the booking of ``key``; whether there was one."""
        self._serials.pop(key, None)
        return self._bookings.pop(key, None) is not None

    def forget(self, key: PodKey) -> None:
        self._bookings.pop(key, None)
        self._serials.pop(key, None)

    def confirm(self, key: PodKey, observed: PodRecord) -> None:
        """The watch shows ``observed`` for ``key``: a booking of the same allocation on the same node is
        done (the API now shows what bind booked)."""
        booking = self._bookings.get(key)
        if booking is not None and (booking.node, booking.allocated) == (observed.node, observed.allocated):
            del self._bookings[key]
            self._serials.pop(key, None)

    def get(self, key: PodKey) -> PodRecord | None:
        return self._bookings.get(key)

    def keys(self) -> set[PodKey]:
        return set(self._bookings)
