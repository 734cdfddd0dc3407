"""SPSC ring of fixed-size records in shared memory.

Publication protocol (argued in docs/ARCHITECTURE.md, "Memory ordering"):

* ``items`` counts published records, ``space`` counts free slots. Both are
  POSIX semaphores; sem_post is a release and a successful sem_wait/trywait an
  acquire on x86-64 and aarch64 alike (POSIX XBD 4.12, glibc CAS orders).
* Producer: take one ``space`` unit (acquire: the consumer's reads of that slot
  happened before its post), write the record, store ``head``, post ``items``
  (release: the record is visible before the unit is).
* Consumer: take one ``items`` unit (acquire), read exactly ONE record at
  ``tail``, store ``tail``, read every piece of side data that belongs to
  its slot (a channel's probability row), and only THEN post ``space``
  (release: every load from the slot is complete before the unit is, so the
  producer, whose acquire of that unit precedes its writes to the slot,
  cannot overwrite what is still to be read). ``take`` is the first half (to
  the ``tail`` store), ``free`` the second (the post); ``pop`` is both, for
  rings whose slots hold nothing outside the record. A consumer never reads
  "everything up to head" after one acquire: a record not covered by a unit
  it took may be half-visible on a weakly ordered CPU.
* ``head`` and ``tail`` are 64-bit, only increase and sit on their own lines;
  the semaphores, not the counters, decide whether a record is there. Both
  sides read the counters from shared memory (never cache them), so a ring can
  change hands (a new consumer thread, a restarted process) after ``reset``.
* The producer never blocks: ``push`` on a full ring returns False at once.
"""
from __future__ import annotations

import struct

import posix_ipc

from .layout import MAGIC, RING_DATA_OFF, RING_HDR, RING_HEAD_OFF, RING_TAIL_OFF
from .shm import drain, wait

_HEAD = RING_HEAD_OFF // 8
_TAIL = RING_TAIL_OFF // 8


class Ring:
    """One SPSC ring: ``cap`` records of ``rec`` (whose first field is the
    record's absolute position, ``seq``) at ``off`` in ``buf``."""

    __slots__ = ("buf", "off", "cap", "rec", "items", "space", "_q", "_data", "_size", "_pack", "_unpack")

    def __init__(
        self,
        buf: memoryview,
        off: int,
        cap: int,
        rec: struct.Struct,
        items: posix_ipc.Semaphore,
        space: posix_ipc.Semaphore,
        init: bool = False,
    ):
        self.buf, self.off, self.cap, self.rec = buf, off, cap, rec
        self.items, self.space = items, space
        self._q = buf[off : off + RING_DATA_OFF].cast("Q")
        self._data = off + RING_DATA_OFF
        self._size = rec.size
        self._pack = rec.pack_into
        self._unpack = rec.unpack_from
        if init:
            RING_HDR.pack_into(buf, off, MAGIC, cap, rec.size)
            self._q[_HEAD] = 0
            self._q[_TAIL] = 0
        else:
            magic, c, size = RING_HDR.unpack_from(buf, off)
            if magic != MAGIC or c != cap or size != rec.size:
                raise ValueError(f"ring at {off}: bad header {magic:#x} {c} {size}")

    # -- producer -----------------------------------------------------------
    def reserve(self) -> int | None:
        """Take a free slot for the next record; None when the ring is full.

        Returns the slot's absolute position. The caller may write side data
        belonging to that slot (the consumer read the slot's previous side
        data before its ``free`` posted this unit), then must ``commit`` it.
        Never blocks.
        """
        # space.value > 0 means our trywait succeeds (only we take units); the
        # check saves the 0.5 us BusyError path on a full ring.
        if self.space.value <= 0:
            return None
        try:
            self.space.acquire(0)  # ACQUIRE: the consumer's loads of this slot (record, side data) are done
        except posix_ipc.BusyError:
            return None
        return self._q[_HEAD]

    def commit(self, h: int, *fields) -> None:
        """Publish the record at position ``h`` (from ``reserve``).

        A record that cannot be packed (a field out of range) raises, and the
        reserved slot is given back: a bad call must not shrink the ring.
        """
        try:
            self._pack(self.buf, self._data + (h % self.cap) * self._size, h, *fields)
        except BaseException:
            self.unreserve()
            raise
        self._q[_HEAD] = h + 1
        self.items.release()  # RELEASE: record and head visible before the unit

    def unreserve(self) -> None:
        """Give back a slot taken by ``reserve`` that will not be committed
        (nothing was published: head did not move)."""
        self.space.release()

    def push(self, *fields) -> bool:
        """Publish one record (``fields`` without seq); False when full."""
        h = self.reserve()
        if h is None:
            return False
        self.commit(h, *fields)
        return True

    # -- consumer -----------------------------------------------------------
    def take(self, timeout: float | None = 0) -> tuple | None:
        """Read the oldest record, waiting up to ``timeout`` s (None: forever),
        WITHOUT giving its slot back; None when there is none.

        The slot stays the consumer's: the producer cannot reserve it, so the
        caller may read side data belonging to it (at position ``rec[0]``),
        then must call ``free`` exactly once, also when that read fails.
        ``tail`` moves here: it is the consumer's own count of records taken
        (``len``, ``reset``); only the ``space`` post gives the slot back.
        """
        if timeout == 0:
            if self.items.value <= 0:
                return None
            try:
                self.items.acquire(0)  # ACQUIRE: pairs with the producer's post
            except posix_ipc.BusyError:
                return None
        elif not wait(self.items, timeout):
            return None
        # the acquire above orders these loads after the producer's stores of
        # the record (and of its side data), which preceded its post
        q = self._q
        t = q[_TAIL]
        rec = self._unpack(self.buf, self._data + (t % self.cap) * self._size)
        q[_TAIL] = t + 1
        return rec

    def free(self) -> None:
        """Give back the slot of the record ``take`` returned: post ``space``.

        Only after every load from the slot (the record and its side data)
        is done: the post is the RELEASE that orders those loads before the
        producer's ``reserve`` (an acquire of this unit) and hence before its
        writes to the slot. Posting first would let it rewrite the slot under
        a reader that was preempted (or, on aarch64, whose loads were merely
        late). ``Channel.read`` posts inline (the token path).
        """
        self.space.release()  # RELEASE: our loads of the slot are done

    def pop(self, timeout: float | None = 0) -> tuple | None:
        """Take the oldest record and free its slot at once (``take`` +
        ``free``): only for rings whose records carry no side data outside
        the record itself (the submission rings). A token ring's reader uses
        ``take``/``free`` around its probability row (ipc/channel.py)."""
        rec = self.take(timeout)
        if rec is not None:
            self.space.release()  # free(), inlined; RELEASE: our read of the slot is done
        return rec

    # -- both ---------------------------------------------------------------
    def __len__(self) -> int:
        """Records published and not yet taken (a monitoring figure)."""
        return max(0, self._q[_HEAD] - self._q[_TAIL])

    @property
    def head(self) -> int:
        return self._q[_HEAD]

    @property
    def tail(self) -> int:
        return self._q[_TAIL]

    def reset(self) -> int:
        """Empty the ring and restore its semaphores; returns records dropped.

        Only while NEITHER side uses the ring (a dead consumer, a quiesced
        worker, a producer that stopped writing to it): this is the recovery
        path after a crash left a unit taken but a counter not yet stored,
        or a slot taken (``take``) and never freed.
        """
        dropped = drain(self.items)
        self._q[_TAIL] = self._q[_HEAD]
        while self.space.value < self.cap:
            self.space.release()
        while self.space.value > self.cap:  # cannot happen unless corrupted
            if not wait(self.space, 0):
                break
        return dropped

    def release(self) -> None:
        """Drop our view of the buffer (before the mapping is closed)."""
        self._q.release()
