"""POSIX shared memory segments and semaphores, named per instance.

Why posix_ipc and not multiprocessing.shared_memory: on Python 3.11 the latter
registers even *attached* segments with a resource tracker that unlinks them
when the attaching process exits. posix_ipc has no tracker: the creator (the
launcher) unlinks what it created, and a start-up sweep removes what a dead
instance left behind.

Names: ``/rs_<16 hex>_<suffix>``. The 64-bit random part comes from
``secrets``, so another local user cannot guess an instance's names; objects
are created O_CREX with mode 0600 (under the umask), so they cannot open them
either.
"""
from __future__ import annotations

import mmap
import os
import re
import secrets
import time

import posix_ipc

PREFIX = "rs_"
_NAME_RE = re.compile(r"^(?:sem\.)?(rs_[0-9a-f]{16})_")
SHM_DIR = "/dev/shm"


def new_instance() -> str:
    """A fresh, unguessable instance name (used as the prefix of every object)."""
    return PREFIX + secrets.token_hex(8)


class Segment:
    """One mapped POSIX shared-memory segment.

    Lifetime rule: ``close()`` unmaps; only the creator calls ``unlink()``.
    Views handed out by ``view()`` must be dropped before ``close()`` (mmap
    refuses to close while buffers are exported; we release ours in close()).
    """

    def __init__(self, name: str, size: int = 0, create: bool = False):
        self.name = name
        if create:
            shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=size)
        else:
            shm = posix_ipc.SharedMemory(name)
            size = shm.size
        self.size = size
        self.mm = mmap.mmap(shm.fd, size)
        shm.close_fd()
        self.buf = memoryview(self.mm)

    def close(self) -> None:
        if self.mm is None:
            return
        self.buf.release()
        try:
            self.mm.close()
        except BufferError:
            # numpy views still alive somewhere; the mapping goes with the process.
            pass
        self.mm = None

    def unlink(self) -> None:
        try:
            posix_ipc.unlink_shared_memory(self.name)
        except posix_ipc.ExistentialError:
            pass


def sem_create(name: str, value: int = 0) -> posix_ipc.Semaphore:
    return posix_ipc.Semaphore(name, posix_ipc.O_CREX, mode=0o600, initial_value=value)


def sem_open(name: str) -> posix_ipc.Semaphore:
    return posix_ipc.Semaphore(name)


def sem_unlink(name: str) -> None:
    try:
        posix_ipc.unlink_semaphore(name)
    except posix_ipc.ExistentialError:
        pass


def wait(sem: posix_ipc.Semaphore, timeout: float | None) -> bool:
    """sem_timedwait that survives signals: True if a unit was taken.

    gunicorn's signal handlers make sem_timedwait return EINTR even under
    SA_RESTART (posix_ipc raises SignalError), so retry with what is left of
    the deadline. A successful return is an acquire fence (POSIX XBD 4.12).
    timeout None waits forever; 0 only tries. The deadline is monotonic:
    sem_timedwait counts on CLOCK_REALTIME, which NTP may slew or step, so a
    timeout that comes back before the monotonic deadline waits again for
    the rest (seen: 0.2 s waits returning after 0.1992 s on a CI VM).
    """
    if timeout is not None and timeout <= 0:
        try:
            sem.acquire(0)
            return True
        except posix_ipc.BusyError:
            return False
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            sem.acquire(None if deadline is None else max(deadline - time.monotonic(), 1e-6))
            return True
        except posix_ipc.BusyError:
            if deadline is None or time.monotonic() >= deadline:
                return False
        except posix_ipc.SignalError:
            if deadline is not None and time.monotonic() >= deadline:
                return wait(sem, 0)


def drain(sem: posix_ipc.Semaphore) -> int:
    """Take every unit a semaphore holds now; returns how many."""
    n = 0
    while sem.value > 0:
        try:
            sem.acquire(0)
            n += 1
        except posix_ipc.BusyError:
            break
    return n


def proc_start(pid: int) -> int:
    """Start time of a process in clock ticks (0 if it does not exist)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return 0
    fields = data[data.rindex(b")") + 2 :].split()
    if fields[0] == b"Z":  # a zombie is dead for our purposes
        return 0
    return int(fields[19])


def alive(pid: int, start: int = 0) -> bool:
    """True if pid runs (not a zombie) and, when given, started at `start`."""
    if pid <= 0:
        return False
    s = proc_start(pid)
    return s != 0 and (start == 0 or s == start)


def instance_entries(instance: str) -> list[str]:
    """/dev/shm file names (segments and 'sem.' files) of one instance."""
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return []
    return sorted(n for n in names if n.startswith(instance + "_") or n.startswith("sem." + instance + "_"))


def unlink_instance(instance: str) -> int:
    """Unlink every object of an instance; returns how many were removed."""
    n = 0
    for entry in instance_entries(instance):
        try:
            if entry.startswith("sem."):
                posix_ipc.unlink_semaphore("/" + entry[4:])
            else:
                posix_ipc.unlink_shared_memory("/" + entry)
            n += 1
        except posix_ipc.ExistentialError:
            pass
    return n


def instances() -> set[str]:
    """Instance names that have at least one object in /dev/shm."""
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return set()
    return {m.group(1) for m in map(_NAME_RE.match, names) if m}
