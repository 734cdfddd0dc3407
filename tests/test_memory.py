"""engine/memory.py's zero-page rule: a page that holds only zeros is given
back and reads as zeros again; a page with data is kept; only ranges mapped
after a snapshot count as new. With the real model: the context's KV (which
llama.cpp zero-fills) is resident only once written, and the logits a
decode gives are the same, bit for bit, as without the rule."""
from __future__ import annotations

import ctypes
import gc
import mmap

import numpy as np

from engine import memory
from engine.config import Config
from engine.model import Model
from engine.weights import Weights

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


def _resident(lo: int, hi: int) -> int:
    """Resident bytes of [lo, hi), page by page (mincore(2)): exact where a
    new mapping was merged into an old neighbour's VMA, which smaps is not."""
    libc = ctypes.CDLL(None, use_errno=True)
    n = (hi - lo + PAGE - 1) // PAGE
    vec = (ctypes.c_ubyte * n)()
    if libc.mincore(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), vec) != 0:
        raise OSError(ctypes.get_errno(), "mincore")
    return sum(v & 1 for v in vec) * PAGE


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


def _greedy(m: Model, prompt: list[int], n: int) -> list[np.ndarray]:
    """n greedy steps on slot 0; every step's logits, copied."""
    m.clear()
    last = m.add_many(prompt, 0, 0, True)
    assert m.decode() == 0
    out = [m.logits(last).copy()]
    pos = len(prompt)
    for _ in range(n - 1):
        m.clear()
        m.add(int(out[-1].argmax()), pos, 0, True)
        assert m.decode() == 0
        out.append(m.logits(0).copy())
        pos += 1
    m.seq_clear(0)
    return out


def _new_resident(before) -> int:
    """Resident bytes of the anonymous ranges mapped since ``before``: what the
    context added, blind to what the rest of the process frees meanwhile (a
    collection of an earlier test's garbage once made a whole-RSS delta lie)."""
    return sum(_resident(lo, hi) for lo, hi in memory.new_anon(before))


def test_the_kv_is_resident_only_where_written_and_decodes_the_same(monkeypatch):
    cfg = Config(parallel=4, ctx_size=4096, batch_size=256, ubatch_size=256, threads=2, flash_attn="on")
    w = Weights(cfg)
    gc.collect()
    before = memory.maps()  # after the weights: their buffers (repacked tensors) hold data
    with Model(cfg, w) as m:
        assert m.zero_dropped >= m.kv_bytes, (m.zero_dropped, m.kv_bytes)  # all of the zero-filled KV
        grew = _new_resident(before)
        assert grew < m.kv_bytes / 8, (grew, m.kv_bytes)
        prompt = m.tokenize("The quick brown fox jumps over the lazy dog. " * 8)
        lazy = _greedy(m, prompt, 8)
    monkeypatch.setattr(memory, "drop_zero_pages", lambda ranges: 0)  # the control: every page resident
    gc.collect()
    before = memory.maps()
    with Model(cfg, w) as m:
        assert m.zero_dropped == 0
        grew = _new_resident(before)
        assert grew >= m.kv_bytes, (grew, m.kv_bytes)  # what llama.cpp's clear makes resident
        full = _greedy(m, prompt, 8)
    w.close()
    assert all(np.array_equal(a, b) for a, b in zip(lazy, full))
