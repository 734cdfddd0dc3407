"""The arena: every shared object of one ringserve instance.

The launcher ``create``s it (segments and semaphores, O_CREX, 0600, an
unguessable per-instance prefix) and is the only process that ``unlink``s it.
The engine and the workers ``attach`` by name (the RINGSERVE_ARENA variable)
and open only the semaphores their role needs.

Objects (names ``/<instance>_<suffix>``):
  ctl          control block: state, pids, heartbeat, geometry, counters,
               histograms, worker table, slot table
  ch           all channels, worker index w owning [w*n_chan, (w+1)*n_chan)
  sub          one submission ring per worker index
  ci<i> cs<i>  channel i's items / space semaphores
  si<w> ss<w>  submission ring w's items / space semaphores
  a<w>         worker index w's registration acknowledgement
  db           the engine's doorbell
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass

import numpy as np
import posix_ipc

from . import shm
from .channel import Channel
from .layout import (
    CNT,
    CTL,
    HIST_NAMES,
    MAGIC,
    N_COUNTERS,
    N_HIST,
    RING_CAP,
    SCRAPE,
    SLOT,
    ST_DOWN,
    ST_FAILED,
    ST_LOADING,
    ST_READY,
    SUB,
    VERSION,
    WORKER,
    chan_layout,
    ctl_layout,
    ring_bytes,
)
from .ring import Ring

HEADROOM = 2  # worker indices beyond 2 x gunicorn workers, for TTIN
CTX_PAD = 256  # llama.cpp pads a slot's context to a multiple of this
ALIVE_TTL = 0.02  # s an engine-pid liveness answer is shared by a process's threads (< gen.POLL)


@dataclass(frozen=True)
class Geometry:
    """Sizes fixed for the life of an arena."""

    n_workers: int = 4  # worker indices: 2x gunicorn workers (SIGHUP overlap)
    n_chan: int = 16  # channels per worker index (>= its threads)
    ring_cap: int = RING_CAP  # token records per channel
    sub_cap: int = 256  # submission records per worker index
    max_prompt: int = 4096  # prompt ids per channel (the slot context)
    n_slots: int = 4

    @classmethod
    def sized(cls, workers: int, threads: int, n_ctx_slot: int, n_slots: int, ring_cap: int) -> "Geometry":
        """The arena a server of ``workers`` gunicorn workers x ``threads``
        threads needs; the one sizing rule for the launcher, the gunicorn
        hooks, the tests and the benchmarks (engine/process.py create_arena).

        Why these sizes: two worker indices per gunicorn worker (after a
        SIGHUP the new workers register before the old ones leave) plus
        HEADROOM for TTIN; a channel per thread (a thread serves one request
        at a time); prompts up to a slot's context as llama.cpp pads it.
        """
        slot = -(-n_ctx_slot // CTX_PAD) * CTX_PAD
        return cls(n_workers=2 * workers + HEADROOM, n_chan=max(threads, 1), ring_cap=ring_cap,
                   max_prompt=slot, n_slots=max(n_slots, 1))

    @property
    def n_channels(self) -> int:
        return self.n_workers * self.n_chan

    def chan_size(self) -> int:
        return chan_layout(self.max_prompt, self.ring_cap)["size"]

    def bytes(self) -> int:
        """All shared memory the arena maps (for sizing /dev/shm)."""
        return (ctl_layout(self.n_workers, self.n_slots)["size"] + self.n_channels * self.chan_size()
                + self.n_workers * ring_bytes(self.sub_cap, SUB.size))


class Arena:
    """One instance's shared objects as seen from one process."""

    def __init__(self, instance: str, geom: Geometry, segs: dict, creator: bool):
        self.instance, self.geom, self.creator = instance, geom, creator
        self.segs = segs
        lay = ctl_layout(geom.n_workers, geom.n_slots)
        buf = segs["ctl"].buf
        self.ctl = np.frombuffer(buf, CTL, 1, 0)
        self.counters = np.frombuffer(buf, np.float64, N_COUNTERS, lay["counters"])
        self.hist = np.frombuffer(buf, np.uint64, N_HIST * len(HIST_NAMES), lay["hist"]).reshape(len(HIST_NAMES), N_HIST)
        self.asleep = np.frombuffer(buf, np.float64, N_COUNTERS, lay["asleep"])  # the engine's, as it fell asleep
        self.scrape = np.frombuffer(buf, SCRAPE, geom.n_workers, lay["scrape"])  # the /metrics windows, a row a worker
        self.workers = np.frombuffer(buf, WORKER, geom.n_workers, lay["workers"])
        self.slots = np.frombuffer(buf, SLOT, geom.n_slots, lay["slots"])
        self._sems: dict[str, posix_ipc.Semaphore] = {}
        self._chans: dict[int, Channel] = {}
        self._subs: dict[int, Ring] = {}
        self._alive: tuple[int, float, bool] = (0, 0.0, False)  # (pid, checked at, alive): _pid_alive

    # ------------------------------------------------------------- lifecycle
    @classmethod
    def create(cls, geom: Geometry, instance: str | None = None) -> "Arena":
        """Create every object of a new instance (the launcher)."""
        instance = instance or shm.new_instance()
        segs: dict[str, shm.Segment] = {}
        made: list[str] = []
        try:
            segs["ctl"] = shm.Segment(f"/{instance}_ctl", ctl_layout(geom.n_workers, geom.n_slots)["size"], create=True)
            ctl = np.frombuffer(segs["ctl"].buf, CTL, 1, 0)
            ctl["launcher_pid"] = os.getpid()
            ctl["launcher_start"] = shm.proc_start(os.getpid())
            for k, v in asdict(geom).items():
                ctl[k] = v
            ctl["state"] = ST_DOWN
            ctl["version"] = VERSION
            ctl["magic"] = MAGIC
            del ctl
            segs["ch"] = shm.Segment(f"/{instance}_ch", geom.n_channels * geom.chan_size(), create=True)
            segs["sub"] = shm.Segment(f"/{instance}_sub", geom.n_workers * ring_bytes(geom.sub_cap, SUB.size), create=True)
            names = [("db", 0)]
            for w in range(geom.n_workers):
                names += [(f"si{w}", 0), (f"ss{w}", geom.sub_cap), (f"a{w}", 0)]
            for i in range(geom.n_channels):
                names += [(f"ci{i}", 0), (f"cs{i}", geom.ring_cap)]
            for suffix, value in names:
                shm.sem_create(f"/{instance}_{suffix}", value).close()
                made.append(suffix)
            arena = cls(instance, geom, segs, creator=True)
            for i in range(geom.n_channels):
                arena.channel(i, init=True)
            for w in range(geom.n_workers):
                arena.sub_ring(w, init=True)
            return arena
        except BaseException:
            for seg in segs.values():
                seg.close()
            shm.unlink_instance(instance)
            raise

    @classmethod
    def attach(cls, instance: str) -> "Arena":
        """Open an existing instance by name (engine, workers, tools)."""
        segs = {"ctl": shm.Segment(f"/{instance}_ctl")}
        ctl = np.frombuffer(segs["ctl"].buf, CTL, 1, 0)
        if ctl["magic"][0] != MAGIC or ctl["version"][0] != VERSION:
            segs["ctl"].close()
            raise ValueError(f"{instance}: not a ringserve arena of version {VERSION}")
        geom = Geometry(**{k: int(ctl[k][0]) for k in Geometry.__dataclass_fields__})
        del ctl
        segs["ch"] = shm.Segment(f"/{instance}_ch")
        segs["sub"] = shm.Segment(f"/{instance}_sub")
        return cls(instance, geom, segs, creator=False)

    def close(self) -> None:
        """Unmap and close (does not unlink). Views must not be used after."""
        for ch in self._chans.values():
            ch.release()
        for r in self._subs.values():
            r.release()
        self._chans.clear()
        self._subs.clear()
        for s in self._sems.values():
            s.close()
        self._sems.clear()
        self.ctl = self.counters = self.hist = self.asleep = self.scrape = self.workers = self.slots = None
        for seg in self.segs.values():
            seg.close()

    def unlink(self) -> int:
        """Remove every object of the instance from the system (the creator)."""
        return shm.unlink_instance(self.instance)

    @staticmethod
    def launcher_of(instance: str) -> tuple[int, int]:
        """(launcher pid, its /proc start time) from an instance's control
        block, read without attaching (no version check: any ringserve
        instance, even one half created). Raises posix_ipc.ExistentialError
        when there is no control block, ValueError when it is too short."""
        seg = shm.Segment(f"/{instance}_ctl")
        try:
            ctl = np.frombuffer(seg.buf, CTL, 1, 0)
            out = int(ctl["launcher_pid"][0]), int(ctl["launcher_start"][0])
            del ctl
        finally:
            seg.close()
        return out

    @staticmethod
    def instance_of(launcher_pid: int) -> str:
        """The instance a launcher process created ("" if none yet)."""
        for inst in sorted(shm.instances()):
            try:
                if Arena.launcher_of(inst)[0] == launcher_pid:
                    return inst
            except (posix_ipc.Error, ValueError):
                continue
        return ""

    @staticmethod
    def sweep(keep: str | None = None) -> list[str]:
        """Unlink the objects of instances whose launcher is dead.

        An instance whose control block cannot be read is only removed once its
        objects are older than a minute (it may be being created right now).
        """
        removed = []
        for inst in shm.instances():
            if inst == keep:
                continue
            try:
                pid, start = Arena.launcher_of(inst)
                dead = pid != 0 and not shm.alive(pid, start)
            except (posix_ipc.ExistentialError, ValueError):
                ages = [time.time() - os.stat(os.path.join(shm.SHM_DIR, e)).st_mtime
                        for e in shm.instance_entries(inst) if os.path.exists(os.path.join(shm.SHM_DIR, e))]
                dead = bool(ages) and min(ages) > 60
            except posix_ipc.PermissionsError:
                continue  # another user's instance
            if dead:
                shm.unlink_instance(inst)
                removed.append(inst)
        return removed

    # ------------------------------------------------------------- objects
    def sem(self, suffix: str) -> posix_ipc.Semaphore:
        s = self._sems.get(suffix)
        if s is None:
            s = self._sems[suffix] = shm.sem_open(f"/{self.instance}_{suffix}")
        return s

    @property
    def doorbell(self) -> posix_ipc.Semaphore:
        return self.sem("db")

    def ack(self, w: int) -> posix_ipc.Semaphore:
        return self.sem(f"a{w}")

    def channel(self, i: int, init: bool = False) -> Channel:
        """Channel i (opened on first use; a process opens only what it uses)."""
        ch = self._chans.get(i)
        if ch is None:
            if not 0 <= i < self.geom.n_channels:
                raise IndexError(f"channel {i} out of range")
            g = self.geom
            ch = self._chans[i] = Channel(self.segs["ch"].buf, i * g.chan_size(), i, g.max_prompt, g.ring_cap,
                                          self.sem(f"ci{i}"), self.sem(f"cs{i}"), init=init)
        return ch

    def sub_ring(self, w: int, init: bool = False) -> Ring:
        r = self._subs.get(w)
        if r is None:
            g = self.geom
            r = self._subs[w] = Ring(self.segs["sub"].buf, w * ring_bytes(g.sub_cap, SUB.size), g.sub_cap, SUB,
                                     self.sem(f"si{w}"), self.sem(f"ss{w}"), init=init)
        return r

    def channels_of(self, w: int) -> range:
        return range(w * self.geom.n_chan, (w + 1) * self.geom.n_chan)

    # ------------------------------------------------------------- control
    def get(self, field: str):
        return self.ctl[field][0].item()

    def set(self, field: str, value) -> None:
        self.ctl[field] = value

    @property
    def state(self) -> int:
        return int(self.ctl["state"][0])

    def engine_alive(self) -> bool:
        return self.state in (ST_LOADING, ST_READY) and self._pid_alive()

    def ready(self) -> bool:
        # read fresh: /health and the readiness gate answer once per request,
        # and must agree with a 503 that another worker has just given
        return self.state == ST_READY and shm.alive(self.get("engine_pid"))

    def _pid_alive(self) -> bool:
        """Whether the engine pid runs, read from /proc at most once per
        ALIVE_TTL per process. Every streaming thread of a worker asks each
        poll (frontends/http/gen.py), and one /proc read per thread per poll
        was a third of a worker's CPU at 32 streams; the threads share this
        answer instead. Lifetime: the answer may be ALIVE_TTL old, so a dead
        engine is noticed that much later (the state field, read fresh every
        time, still ends a request at once when the launcher marks it); a new
        engine pid misses the cache at once. The tuple is replaced whole, so a
        thread never reads a pid with another pid's answer. ``ready()`` (the
        per-request gate and /health) does not use it."""
        pid, now = self.get("engine_pid"), time.monotonic()
        cpid, at, ok = self._alive
        if cpid == pid and now - at < ALIVE_TTL:
            return ok
        ok = shm.alive(pid)
        self._alive = (pid, now, ok)
        return ok

    def fail(self, reason: str) -> None:
        self.ctl["reason"] = reason.encode("utf-8", "replace")[:255]
        self.ctl["state"] = ST_FAILED

    def count(self, name: str) -> float:
        return float(self.counters[CNT[name]])

    def start_engine_epoch(self, pid: int) -> int:
        """Called by a starting engine: new epoch, state loading."""
        self.ctl["engine_pid"] = pid
        self.ctl["epoch"] = self.get("epoch") + 1
        self.ctl["state"] = ST_LOADING
        return self.get("epoch")
