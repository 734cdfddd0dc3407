"""Giving memory back once a process has set itself up (issue 14: the tree's
PSS against llama-server's).

Each call runs once, at the end of a process's start-up, never on a hot path:

* ``settle(freeze)``: ``gc.collect()``, then glibc's ``malloc_trim(0)``: what
  start-up freed (libllama's GGUF metadata and load temporaries, import-time
  garbage) goes back to the kernel instead of staying in malloc's free lists.
  With ``freeze`` (the gunicorn master, just before it forks workers),
  ``gc.freeze()`` moves every object alive into the permanent generation: a
  worker's collections then never walk (and write the headers of) the
  objects it inherited, so their pages stay shared copy-on-write.
* ``drop_file_pages(path)``: ``madvise(MADV_DONTNEED)`` over this process's
  mappings of ``path`` (the GGUF). llama.cpp reads every tensor through its
  mapping while it loads, also the ones it then copies into a buffer of its
  own (CPU_REPACK's rearranged weights, offloaded layers outside the ranges
  it unmaps), and those pages stay resident in the mapping for the process's
  life. Dropping the whole mapping is safe: it stays mapped, read-only, file
  backed; a page that is used faults back in from the page cache (a minor
  fault, no copy) at its first use, so only the pages nothing reads stay out.

* ``drop_zero_pages(ranges)``: ``MADV_DONTNEED`` over every page of those
  anonymous ranges that holds only zeros. llama.cpp zero-fills each KV
  buffer when it creates a context (``ggml_backend_buffer_clear(buf, 0)``),
  so every cell of every stream is resident from the start, also the ones no
  request will reach (8 slots of 1,024 cells holding 110-token streams: 89%
  of 144 MiB). A dropped private anonymous page reads as zeros, exactly what
  it held, and is resident again at its first write: the KV then costs what
  the streams have written. Only pages that are all zero are dropped, so the
  rule is exact for any buffer in the range (KV, logits, compute, a malloc
  chunk's header page is never zero); the one hazard is a write racing the
  check, so the caller runs it where no other thread can write those pages
  (engine/model.py: the context's new mappings, in the thread that created
  them, before any decode), and only over ``malloc_chunks`` of them: the
  checking thread's own Python objects may land in a pymalloc arena mapped
  meanwhile, never inside a malloc chunk of its own mapping. The same rule gives back the logits rows no
  decode writes: llama.cpp reserves (and zero-fills) one row of n_vocab
  floats per sequence id, parallel + the parking streams of --cache-streams
  (1 MiB a row with Gemma's 262k vocabulary), where a decode writes at most
  Batch.max_out rows, from row 0.

* ``mmap_threshold(nbytes)``: glibc ``mallopt(M_MMAP_THRESHOLD)``, fixed.
  The engine's RAM-tier blobs (engine/ramcache.py, MiBs each) must each be
  their own mapping, unmapped the moment their entry goes, so RSS follows
  the tier's bytes. glibc's default threshold is dynamic: the first free of
  an mmapped chunk raises it (up to 32 MiB), and the next blobs came from
  the brk heap, where freed holes stay resident (issue 24: the engine's heap
  grew to 214 MiB for ~150 MiB of blobs over bench_cache's prefix
  workload). Setting it fixes it and turns the dynamic rule off.

All are no-ops where the call does not exist (non-glibc, non-Linux).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import mmap
import os

log = logging.getLogger("ringserve")

MADV_DONTNEED = getattr(mmap, "MADV_DONTNEED", 4)


def _libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


def malloc_trim() -> bool:
    """glibc ``malloc_trim(0)``: free pages inside every malloc arena go back
    to the kernel. False where there is no such call."""
    libc = _libc()
    fn = getattr(libc, "malloc_trim", None)
    if fn is None:
        return False
    fn.argtypes = [ctypes.c_size_t]
    return bool(fn(0))


M_MMAP_THRESHOLD = -3  # glibc malloc.h


def mmap_threshold(nbytes: int) -> bool:
    """Allocations of ``nbytes`` or more get their own mapping, always
    (module doc). False where there is no mallopt."""
    fn = getattr(_libc(), "mallopt", None)
    if fn is None:
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(fn(M_MMAP_THRESHOLD, nbytes))


def settle(freeze: bool = False) -> None:
    """End of start-up: collect, optionally freeze (before fork), trim."""
    gc.collect()
    if freeze:
        gc.freeze()
    malloc_trim()


def file_mappings(path: str) -> list[tuple[int, int]]:
    """(start, end) of this process's mappings of ``path`` (/proc/self/maps)."""
    try:
        real = os.path.realpath(path)
        out = []
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].rstrip("\n") == real:
                    lo, hi = parts[0].split("-")
                    out.append((int(lo, 16), int(hi, 16)))
        return out
    except OSError:
        return []


def _madvise(lo: int, hi: int) -> bool:
    libc = _libc()
    fn = getattr(libc, "madvise", None)
    if fn is None or hi <= lo:
        return False
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return fn(lo, hi - lo, MADV_DONTNEED) == 0


def drop_range(lo: int, hi: int) -> int:
    """MADV_DONTNEED over the whole pages inside [lo, hi) (anonymous memory
    whose pages read as zeros from now on); returns the bytes given back."""
    page = mmap.PAGESIZE
    a, b = -(-lo // page) * page, hi // page * page
    if b <= a:
        return 0
    if not _madvise(a, b):  # e.g. pinned (cudaHostAlloc) memory: keep it, nothing is wrong
        log.debug("madvise(MADV_DONTNEED) on [%#x, %#x) failed: %s", a, b, os.strerror(ctypes.get_errno()))
        return 0
    return b - a


def maps() -> list[tuple[int, int, str, str]]:
    """This process's mappings: (start, end, perms, name) from /proc/self/maps."""
    out = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                lo, hi = parts[0].split("-")
                out.append((int(lo, 16), int(hi, 16), parts[1], parts[5].strip() if len(parts) == 6 else ""))
    except OSError:
        pass
    return out


def threads() -> frozenset[str]:
    """This process's thread ids (/proc/self/task)."""
    try:
        return frozenset(os.listdir("/proc/self/task"))
    except OSError:
        return frozenset()


def new_anon(before: list[tuple[int, int, str, str]], min_bytes: int = 1 << 20) -> list[tuple[int, int]]:
    """The private, writable, nameless address ranges mapped since ``before``
    was read, at least ``min_bytes`` each: a new mapping minus every range
    that was mapped before in any mode (the kernel merges an adjacent new
    mapping into an old one; an old malloc arena grows inside its own
    reserved range, so nothing of one counts as new)."""
    old = sorted((lo, hi) for lo, hi, _, _ in before)
    out = []
    for lo, hi, perms, name in maps():
        if name or not perms.startswith("rw") or not perms.endswith("p"):
            continue
        cur = lo
        for a, b in old:
            if b <= cur or a >= hi:
                continue
            if a > cur:
                out.append((cur, a))
            cur = max(cur, b)
        if cur < hi:
            out.append((cur, hi))
    return [(a, b) for a, b in out if b - a >= min_bytes]


def _pages(ranges: list[tuple[int, int]]):
    """(start, uint64 view) of the whole pages inside each of ``ranges`` (read in place, no copy)."""
    import numpy as np
    page = mmap.PAGESIZE
    for lo, hi in ranges:
        a, b = -(-lo // page) * page, hi // page * page
        if b > a:
            yield a, np.ctypeslib.as_array((ctypes.c_uint64 * ((b - a) // 8)).from_address(a))


IS_MMAPPED = 2  # glibc malloc's chunk flag (malloc.c): in the low 3 bits of a chunk's size field


def malloc_chunks(ranges: list[tuple[int, int]], min_bytes: int = 1 << 20) -> list[tuple[int, int]]:
    """The parts of ``ranges`` that are glibc malloc chunks of their own mapping
    (``min_bytes`` or more: every allocation past ``mmap_threshold``), less
    each chunk's first page (its header).

    Why: ``drop_zero_pages`` is exact only where nothing writes a page between
    its check and its madvise, and the thread that runs it is a Python
    interpreter: the check's own objects come from pymalloc, whose 1 MiB
    arenas are nameless private mappings too, so an arena mapped while the
    context was created is one of new_anon's ranges (the kernel even merges
    it with a llama.cpp buffer next to it), and a pool the check began in a
    zero page of it was wiped by the madvise that followed: a forked engine
    died of SIGSEGV in its next garbage collection (tests/test_bench_spec.py,
    2026-12-06). llama.cpp's CPU buffers (KV, logits, compute) come from
    posix_memalign, so past the threshold each is a glibc chunk mapped alone,
    whose mapping starts with the chunk's header: prev_size 0 and a size (a
    whole number of pages that fits the range) flagged IS_MMAPPED alone. A
    pymalloc arena never starts a page that way (a pool's header starts with
    its count of used blocks; a zero page has a zero size), so only chunks are
    checked, and an arena is walked over a page at a time. A chunk whose header
    page was split into a mapping of its own (numpy's MADV_HUGEPAGE on a large
    array does that) is not found: left resident, never wrongly dropped."""
    page = mmap.PAGESIZE
    pw = page // 8
    out = []
    for a, words in _pages(ranges):
        n, i = len(words) // pw, 0
        while i < n:
            h0, h1 = int(words[i * pw]), int(words[i * pw + 1])
            size = h1 & ~7
            if h0 == 0 and h1 & 7 == IS_MMAPPED and size >= min_bytes and size % page == 0 and i + size // page <= n:
                out.append((a + (i + 1) * page, a + i * page + size))
                i += size // page
            else:
                i += 1
    return out


def drop_zero_pages(ranges: list[tuple[int, int]]) -> int:
    """MADV_DONTNEED over the pages of ``ranges`` that hold only zeros (module
    doc: exact, if nothing writes them meanwhile, so pass no memory a Python
    object may be put in: `malloc_chunks`); returns the bytes given back."""
    import numpy as np

    page = mmap.PAGESIZE
    done = 0
    for a, words in _pages(ranges):
        zero = ~words.reshape(-1, page // 8).any(axis=1)  # reading an untouched page maps the zero page
        edges = np.flatnonzero(np.diff(np.concatenate(([0], zero.astype(np.int8), [0]))))
        for s, e in zip(edges[0::2], edges[1::2]):
            done += drop_range(a + int(s) * page, a + int(e) * page)
    return done


def drop_file_pages(path: str) -> int:
    """MADV_DONTNEED over every mapping of ``path``; returns the bytes advised
    (0 where nothing is mapped or madvise is missing)."""
    done = 0
    for lo, hi in file_mappings(path):
        if _madvise(lo, hi):
            done += hi - lo
        else:
            log.warning("madvise(MADV_DONTNEED) on %s failed: %s", path, os.strerror(ctypes.get_errno()))
    return done
