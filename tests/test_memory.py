"""engine/memory.py's zero-page rule: a page that holds only zeros is given
back and reads as zeros again; a page with data is kept; only ranges mapped
after a snapshot count as new. With the real model: the context's KV (which
llama.cpp zero-fills) is resident only once written, and the logits a
decode gives are the same, bit for bit, as without the rule (in fresh
interpreters: a long test process's heap serves a new buffer from its free
chunks, which no rule over new mappings sees)."""
from __future__ import annotations

import ctypes
import mmap

import numpy as np

import _procs
from engine import memory

PAGE = mmap.PAGESIZE


def _rss(lo: int, hi: int) -> int:
    """Resident bytes of the mappings that overlap [lo, hi) (smaps)."""
    rss, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(None, 1)[0]
            if "-" in head and not head.endswith(":"):
                a, b = (int(x, 16) for x in head.split("-"))
                inside = a < hi and b > lo
            elif inside and head == "Rss:":
                rss += int(line.split()[1]) * 1024
    return rss


def test_zero_pages_go_back_and_data_stays():
    n = 64
    # one page of PROT_NONE each side: the kernel cannot merge our range into a neighbour's mapping
    buf = mmap.mmap(-1, (n + 2) * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = np.frombuffer(buf, dtype=np.uint8).ctypes.data
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(base, PAGE, 0) == 0 and libc.mprotect(base + (n + 1) * PAGE, PAGE, 0) == 0
    a = np.frombuffer(buf, dtype=np.uint8)[PAGE:(n + 1) * PAGE]
    a[:] = 0  # resident, as llama.cpp's clear makes the KV
    data = [3, 4, 40, 63]
    for i in data:
        a[i * PAGE + 17] = i + 1
    a[10 * PAGE + PAGE - 1] = 9  # a page whose only non-zero byte is its last
    data.append(10)
    lo = base + PAGE
    assert _rss(lo, lo + n * PAGE) == n * PAGE
    given = memory.drop_zero_pages([(lo, lo + n * PAGE)])
    assert given == (n - len(data)) * PAGE
    assert _rss(lo, lo + n * PAGE) == len(data) * PAGE
    want = np.zeros(n * PAGE, dtype=np.uint8)
    for i in data[:-1]:
        want[i * PAGE + 17] = i + 1
    want[10 * PAGE + PAGE - 1] = 9
    assert np.array_equal(a, want)  # a dropped page reads as zeros: nothing changed
    a[0] = 5  # and faults back in at its first write
    assert a[0] == 5 and _rss(lo, lo + n * PAGE) == (len(data) + 1) * PAGE
    del a
    buf.close()


def test_only_ranges_mapped_since_the_snapshot_are_new():
    old = mmap.mmap(-1, 4 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    before = memory.maps()
    new = mmap.mmap(-1, 4 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    ranges = memory.new_anon(before)
    at = lambda m: np.frombuffer(m, dtype=np.uint8).ctypes.data  # noqa: E731
    assert any(lo <= at(new) and at(new) + (4 << 20) <= hi for lo, hi in ranges), ranges
    assert not any(lo < at(old) + (4 << 20) and hi > at(old) for lo, hi in ranges), ranges
    old.close()
    new.close()


def test_only_malloc_chunks_are_checked_not_raw_mappings():
    """A pymalloc arena is a raw anonymous mapping that this thread writes while it checks
    pages (a pool begun in a zero page, then wiped: a SIGSEGV at the next collection); malloc's
    own mappings (llama.cpp's buffers) start with a chunk header and are the only ones checked.
    The chunk is laid out here as glibc maps one (whether glibc maps a new chunk or reuses a free
    one depends on what the process freed before: not this test's question)."""
    before = memory.maps()
    n = 4 << 20
    chunk = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    c = np.frombuffer(chunk, dtype=np.uint64)
    c[0], c[1] = 0, n | memory.IS_MMAPPED  # malloc.c's header of a chunk mapped alone: prev_size, size | flag
    raw = mmap.mmap(-1, 2 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # as pymalloc maps an arena
    r = np.frombuffer(raw, dtype=np.uint8)
    r[3 * PAGE] = 1  # a pool in use, the rest zero
    r[5 * PAGE + 8] = 2 | 1  # a page that looks flagged but has no header (prev_size 0, size 3): not a chunk
    chunks = memory.malloc_chunks(memory.new_anon(before))
    lo, rlo = c.ctypes.data, r.ctypes.data
    assert (lo + PAGE, lo + n) in chunks, chunks  # all of it but its header page
    assert not any(a < rlo + (2 << 20) and b > rlo for a, b in chunks), chunks
    del c, r
    chunk.close()
    raw.close()


def _run(lazy: bool, tmp_path) -> dict:
    out = str(tmp_path / f"lazy{int(lazy)}.npz")
    p = _procs.start(_procs.kv_residency, lazy, out)
    _procs.stop(p, timeout=120.0)
    assert p.exitcode == 0, f"the model child (lazy={lazy}) exited with {p.exitcode}"
    with np.load(out) as z:
        return {k: z[k] for k in z.files}


def test_the_kv_is_resident_only_where_written_and_decodes_the_same(tmp_path):
    """In fresh interpreters, as the engine is (tests/_procs.py kv_residency):
    with the rule the context adds less than 1/8 of its KV to RSS, without it
    all of it (llama.cpp's clear), and the logits are the same bit for bit."""
    lazy, full = _run(True, tmp_path), _run(False, tmp_path)
    kv = int(lazy["kv"])
    assert int(lazy["dropped"]) >= kv, (int(lazy["dropped"]), kv)  # the zero-filled KV and more
    assert int(lazy["grew"]) < kv / 8, (int(lazy["grew"]), kv)
    assert int(full["dropped"]) == 0
    assert int(full["grew"]) >= kv, (int(full["grew"]), kv)
    assert np.array_equal(lazy["logits"], full["logits"])
