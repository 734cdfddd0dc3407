"""Leak hunting in a running process tree: tracemalloc and allocator figures on a signal.

Off unless ``RINGSERVE_TRACEMALLOC`` is set (a directory; ``1`` means
``/tmp/ringserve-memtrace``): then ``install(role)`` starts tracemalloc and
makes the process answer ``SIGNAL`` (and its exit) by appending one JSON line
to ``DIR/<role>-<pid>.jsonl`` and writing the top growth to
``DIR/<role>-<pid>-<n>.txt``. Each line holds what tells a Python leak from
allocator behaviour:

* ``rss_kb``, ``anon_kb``, ``file_kb``: the kernel's view (smaps_rollup);
* ``traced``: bytes Python objects hold now (tracemalloc; numpy data too);
* ``malloc_used`` / ``malloc_free`` / ``malloc_mmap`` / ``arenas``: glibc's
  view (mallinfo2 summed over every arena, malloc_info's heap count): bytes in
  use, bytes free but kept inside arenas, bytes in direct mmaps;
* ``top`` (unless ``RINGSERVE_TRACEMALLOC_FRAMES=0``, which leaves
  tracemalloc off so that the malloc figures describe the server alone, not
  the tracer's tables too): the source lines whose traced size grew most since the first dump
  and since the previous one (size and object count).

RSS growth that ``traced`` follows is Python objects kept; growth in
``malloc_used`` that ``traced`` does not follow is native (libllama, libc);
growth in ``malloc_free`` is fragmentation a ``malloc_trim`` could give back.
Every process calls ``install`` once at start, so with the variable unset the
only cost is one environment lookup: nothing sits on a hot path.

Why a real-time signal and not SIGUSR2: gunicorn's master re-executes itself
on SIGUSR2 and its workers reset USR1/USR2 to the default action (terminate)
after fork. ``kill -s RTMIN+2 PID`` (bash) or ``os.kill(pid, memtrace.SIGNAL)``.
"""
from __future__ import annotations

import atexit
import ctypes
import gc
import json
import os
import signal
import sys
import tempfile
import threading
import time

ENV = "RINGSERVE_TRACEMALLOC"
DEFAULT_DIR = "/tmp/ringserve-memtrace"
SIGNAL = signal.SIGRTMIN + 2
FRAMES_ENV = "RINGSERVE_TRACEMALLOC_FRAMES"  # traceback depth per allocation, default 6; 0: allocator figures only
TOP = 25


def directory() -> str:
    """Where dumps go ("" when tracing is off)."""
    v = os.environ.get(ENV, "")
    if v in ("", "0"):
        return ""
    return DEFAULT_DIR if v == "1" else v


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _libc():
    """glibc's malloc statistics calls; None elsewhere (musl has no mallinfo2)."""
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "mallinfo2"):
        return None
    libc.mallinfo2.restype = _MallInfo2
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    return libc


def smaps() -> dict:
    """Rss, Anonymous and file-backed kB of this process (smaps_rollup)."""
    out = {}
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("Rss", "Anonymous", "Private_Dirty", "Pss"):
                    out[k] = int(v.split()[0])
    except OSError:
        pass
    rss, anon = out.get("Rss", 0), out.get("Anonymous", 0)
    return {"rss_kb": rss, "anon_kb": anon, "file_kb": rss - anon, "pss_kb": out.get("Pss", 0),
            "dirty_kb": out.get("Private_Dirty", 0)}


def malloc_figures(libc) -> dict:
    """glibc's totals over every arena, and how many arenas (heaps) exist."""
    if libc is None:
        return {"malloc_used": 0, "malloc_free": 0, "malloc_mmap": 0, "malloc_arena_bytes": 0, "arenas": 0}
    m = libc.mallinfo2()
    n = 0
    fd, path = tempfile.mkstemp(prefix="rs-mallinfo-")
    os.close(fd)
    try:
        fp = libc.fopen(path.encode(), b"w")
        if fp:
            libc.malloc_info(0, fp)
            libc.fclose(fp)
            with open(path) as f:
                n = f.read().count("<heap nr=")
    finally:
        os.unlink(path)
    return {"malloc_used": m.uordblks + m.hblkhd, "malloc_free": m.fordblks, "malloc_mmap": m.hblkhd,
            "malloc_arena_bytes": m.arena, "arenas": n}


class Tracer:
    """One process's dumps: the first snapshot is the baseline of every diff."""

    def __init__(self, role: str, out: str):
        import tracemalloc

        self.tm = tracemalloc
        self.role, self.out = role, out
        self.pid = os.getpid()
        self.n = 0
        self.lock = threading.Lock()
        self.libc = _libc()
        # tracemalloc's own tables live in malloc: with it on, the malloc figures
        # describe the tracer too. Frames 0 leaves it off for clean allocator figures.
        self.frames = int(os.environ.get(FRAMES_ENV, "6"))
        if self.frames > 0 and not tracemalloc.is_tracing():
            tracemalloc.start(self.frames)

    def rebind(self, role: str) -> None:
        """After fork: a new process, new files, a new baseline (the parent's
        snapshots describe the parent)."""
        self.role, self.pid, self.n = role, os.getpid(), 0
        self.lock = threading.Lock()

    def _path(self, suffix: str) -> str:
        return f"{self.out}/{self.role}-{self.pid}{suffix}"

    def _top(self, snap, base, key: str = "lineno") -> list:
        # neither tracemalloc's nor our own allocations (linecache filled by formatting stacks)
        flt = [self.tm.Filter(False, self.tm.__file__), self.tm.Filter(False, __file__, all_frames=True)]
        stats = snap.filter_traces(flt).compare_to(base.filter_traces(flt), key)
        stats.sort(key=lambda s: (-s.size_diff, str(s.traceback)))
        return [s for s in stats if s.size_diff > 0]

    def dump(self, why: str = "signal") -> dict:
        """Measure, then snapshot. The figures are read before the snapshot is
        taken, and snapshots live on disk between dumps (a snapshot in memory
        is tens of MB the next figures would count)."""
        if not self.lock.acquire(blocking=False):  # a signal during a dump: that dump answers it
            return {}
        try:
            collected = gc.collect()  # cycles are not a leak until the collector had its chance
            cur, peak = self.tm.get_traced_memory() if self.tm.is_tracing() else (0, 0)
            rec = {"t": time.time(), "role": self.role, "pid": self.pid, "n": self.n, "why": why, **smaps(),
                   "traced": cur, "traced_peak": peak, "blocks": sys.getallocatedblocks(), "gc_collected": collected,
                   "threads": threading.active_count(), **malloc_figures(self.libc)}
            if not self.tm.is_tracing():
                rec["top"], rec["top_prev"] = [], []
                return self._write(rec)
            snap = self.tm.take_snapshot()
            first, prev = self._path("-snap0"), self._path("-snapprev")
            if self.n == 0:
                snap.dump(first)
                rec["top"], rec["top_prev"] = [], []
            else:
                base = self.tm.Snapshot.load(first)
                grown = self._top(snap, base)
                rec["top"] = [{"where": str(s.traceback), "size": s.size_diff, "count": s.count_diff}
                              for s in grown[:TOP]]
                stacks = self._top(snap, base, "traceback")[:10]
                del base
                last = self.tm.Snapshot.load(prev)
                rec["top_prev"] = [{"where": str(s.traceback), "size": s.size_diff, "count": s.count_diff}
                                   for s in self._top(snap, last)[:TOP]]
                del last
                with open(self._path(f"-{self.n}.txt"), "w") as f:
                    f.write(f"{self.role} pid {self.pid} dump {self.n} ({why}): rss {rec['rss_kb']} kB, "
                            f"traced {cur} B, malloc used {rec['malloc_used']} free {rec['malloc_free']}, "
                            f"{rec['arenas']} arenas, {rec['threads']} threads\n\ngrowth since the first dump:\n")
                    for s in stacks:
                        f.write(f"\n{s.size_diff:+,} B, {s.count_diff:+,} blocks\n")
                        f.write("\n".join(s.traceback.format()) + "\n")
            snap.dump(prev)
            del snap
            return self._write(rec)
        finally:
            self.lock.release()

    def _write(self, rec: dict) -> dict:
        with open(self._path(".jsonl"), "a") as f:
            f.write(json.dumps(rec) + "\n")
        self.n += 1
        return rec


_tracer: Tracer | None = None


def _on_signal(signum, frame) -> None:
    # In the main thread, between two bytecodes: no new thread (it would get a
    # malloc arena of its own and disturb what is measured). dump() takes no
    # lock the interrupted code could hold, except its own.
    if _tracer is not None:
        _tracer.dump()


def _at_exit() -> None:
    if _tracer is not None and _tracer.pid == os.getpid():
        try:
            _tracer.dump("exit")
        except Exception:  # noqa: BLE001 - never fail an exit over a diagnostic
            pass


def install(role: str) -> bool:
    """Trace this process as ``role`` if RINGSERVE_TRACEMALLOC asks; True if on.
    Call from the main thread (signal handlers live there); again after a fork
    to start the child's own files and baseline."""
    global _tracer
    out = directory()
    if not out:
        return False
    os.makedirs(out, exist_ok=True)
    if _tracer is None:
        _tracer = Tracer(role, out)
        atexit.register(_at_exit)
    else:
        _tracer.rebind(role)
    signal.signal(SIGNAL, _on_signal)
    return True
