#!/usr/bin/env python3
"""The seed's fault storm against ringserve, with a control run first.

Four wedge shapes at once against 8 slots (shared/seed/...result-queue-pr.txt):
W1 x2 raw-socket streams with a 2 kB receive buffer that never read, held
--hold seconds (the worker's send() blocks, its reader stops, the ring fills,
the slot must pause and not slow anyone else); W2 x2 read 256 bytes then RST
(SO_LINGER {1,0}) while tokens flow; W3 a non-streaming request RST mid
generation; W4 /slots/{id}?action=erase repeated while the wedges are held.
24 healthy greedy clients run through the storm (6 at a time) and 8 after it,
alternating streamed and non-streamed, /health polled at 2 Hz throughout.
The control run is the same server settings and the same healthy requests
without the wedges (also 6 at a time, see POOL), on a fresh server.

Why -ub 1 (batch-invariant mode, testing.INVARIANT): llama.cpp's CPU kernels
give different logits for the same sequence in batches of different width,
so greedy outputs under concurrency differ from run to run on their own.
With one token per graph they cannot, and every healthy output must equal
the control's output for its prompt byte for byte (stronger than the seed's
"same set of md5s").

Usage: python scripts/fault_storm.py [--quick] [--n-predict N] [--hold S]
Exit 0 when every figure meets its goal (--quick: generous rate bound;
12 healthy requests during the storm and 4 after, n_predict 8, held 2.5 s).
"""
from __future__ import annotations

import argparse
import queue
import random
import socket
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field

from frontends import testing as S

# --ring-cap 32: a non-reading client's slot pauses once its receive window
# (~35 events with a 2 kB buffer), 2 KiB unsent (frontends/http/gen.py
# HOLD_UNSENT) and 32 records are full: about 66 tokens, 6-7 s of the hold
# at ~10 tok/s per slot under -ub 1 (the default 64 records: about 100).
FLAGS = ("-c", "8192", "-np", "8", "-t", "2", "-w", "2", "--threads-http", "16", "--metrics", "--ring-cap", "32",
         *S.INVARIANT)
N_DURING, N_AFTER = 24, 8
QUICK_DURING, QUICK_AFTER = 12, 4  # --quick: two waves of 6 through the storm, 4 after it
# Healthy streams at once, in both runs: the storm's 6 beside its 2
# never-reading wedges fill the 8 slots. With -ub 1 a step costs in
# proportion to the tokens in it, so the control must batch the same 6
# healthy streams: then the storm can only be slower by what the wedges add
# to the batch before their slots pause, which is what the goal bounds.
POOL = 6


@dataclass
class Healthy:
    prompt: int
    stream: bool
    ok: bool = False
    text: str = ""
    rate: float = 0.0  # server-measured decode tokens/s of this request
    error: str = ""


@dataclass
class Run:
    healthy: list[Healthy] = field(default_factory=list)
    health: list[int] = field(default_factory=list)
    rc: int | None = None
    shm_left: list[str] = field(default_factory=list)
    paused_seen: int = 0
    pauses: float = 0.0
    cancels: float = 0.0
    erases: int = 0
    wedge_notes: list[str] = field(default_factory=list)
    left_busy: tuple[float, float] = (-1.0, -1.0)  # slots busy, channels leased once all clients are gone


def one_healthy(base: str, h: Healthy, n_predict: int) -> None:
    body = {"prompt": S.PROMPTS[h.prompt], "n_predict": n_predict, "temperature": 0, "top_k": 1}
    if h.stream:
        status, ev = S.stream(base + "/completion", body, timeout=600)
        final = ev[-1] if ev else {}
        h.text = S.content(ev)
    else:
        status, final = S.post(base + "/completion", body, timeout=600)
        final = final if isinstance(final, dict) else {}
        h.text = final.get("content", "")
    h.ok = status == 200 and final.get("stop") is True and "error" not in final
    h.rate = float(final.get("timings", {}).get("predicted_per_second", 0.0))
    if not h.ok:
        h.error = f"{status} {str(final)[:200]}"


def run_pool(base: str, items: list[Healthy], n_predict: int, width: int) -> None:
    q: queue.Queue[Healthy] = queue.Queue()
    for h in items:
        q.put(h)

    def worker() -> None:
        while True:
            try:
                h = q.get_nowait()
            except queue.Empty:
                return
            one_healthy(base, h, n_predict)

    ts = [threading.Thread(target=worker) for _ in range(width)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


# ------------------------------------------------------------------ wedges
def w1_never_reads(port: int, hold: float, notes: list[str]) -> None:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    s.connect(("127.0.0.1", port))
    s.sendall(S.raw_request("/completion", {"prompt": "Write a very long story about a dragon.",
                                            "n_predict": 100000, "stream": True, "temperature": 0}))
    time.sleep(hold)
    S.reset_close(s)
    notes.append("W1 held")


def w2_read_then_rst(port: int, notes: list[str]) -> None:
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(S.raw_request("/completion", {"prompt": "Tell me everything about the ocean.",
                                            "n_predict": 100000, "stream": True}))
    got = b""
    s.settimeout(60)
    while len(got) < 256:
        chunk = s.recv(256 - len(got))
        if not chunk:
            break
        got += chunk
    S.reset_close(s)
    notes.append(f"W2 read {len(got)} B then RST")


def w3_nonstream_rst(port: int, notes: list[str]) -> None:
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(S.raw_request("/completion", {"prompt": "Explain the history of Rome in detail.",
                                            "n_predict": 100000}))
    time.sleep(1.0)
    S.reset_close(s)
    notes.append("W3 RST after 1 s")


def w4_erase(base: str, until: threading.Event, run: Run) -> None:
    rng = random.Random(4)
    while not until.is_set():
        status, _ = S.post(base + f"/slots/{rng.randrange(8)}?action=erase", b"", timeout=10)
        if status == 200:
            run.erases += 1
        until.wait(0.25)


def watch_paused(base: str, until: threading.Event, run: Run) -> None:
    """Largest number of slots seen busy but not generating (paused on a full ring)."""
    while not until.is_set():
        paused = sum(1 for s in S.slots(base) if s["is_processing"] and s.get("next_token")
                     and not s["next_token"][0]["has_next_token"] and s["next_token"][0]["n_decoded"] > 0)
        run.paused_seen = max(run.paused_seen, paused)
        until.wait(0.5)


# ------------------------------------------------------------------ runs
def one_run(storm: bool, n_predict: int, hold: float, during: int = N_DURING, after_n: int = N_AFTER) -> Run:
    run = Run()
    plan = [Healthy(i % 4, i % 2 == 1) for i in range(during + after_n)]
    run.healthy = plan
    srv = S.Server(*FLAGS)
    try:
        before = S.metrics(srv.base)
        poller = S.HealthPoller(srv.base, 2.0)
        poller.start()
        held = threading.Event()
        threads = []
        if storm:
            threads = [threading.Thread(target=w1_never_reads, args=(srv.port, hold, run.wedge_notes)) for _ in range(2)]
            threads += [threading.Thread(target=w2_read_then_rst, args=(srv.port, run.wedge_notes)) for _ in range(2)]
            threads += [threading.Thread(target=w3_nonstream_rst, args=(srv.port, run.wedge_notes))]
            threads += [threading.Thread(target=w4_erase, args=(srv.base, held, run)),
                        threading.Thread(target=watch_paused, args=(srv.base, held, run))]
            for t in threads:
                t.start()
            time.sleep(0.3)  # the wedges take their slots first
        run_pool(srv.base, plan[:during], n_predict, POOL)
        for t in threads[:5]:
            t.join()
        held.set()
        for t in threads[5:]:
            t.join()
        run_pool(srv.base, plan[during:], n_predict, after_n)
        run.health = poller.stop()
        idle = lambda: S.metrics(srv.base).get("ringserve:slots_busy") == 0  # noqa: E731
        try:
            S.wait_for(idle, 10, "idle slots", step=0.1)
        except TimeoutError:
            pass  # reported below through left_busy
        after = S.metrics(srv.base)
        run.left_busy = (after.get("ringserve:slots_busy", -1.0), after.get("ringserve:channels_leased", -1.0))
        key = lambda m, k: m.get(k, 0.0)  # noqa: E731
        run.pauses = key(after, "ringserve:ring_full_pauses_total") - key(before, "ringserve:ring_full_pauses_total")
        run.cancels = key(after, "ringserve:cancels_total") - key(before, "ringserve:cancels_total")
    finally:
        run.rc, run.shm_left = srv.finish()
    return run


def md5s(run: Run) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for h in run.healthy:
        if h.ok:
            out.setdefault(h.prompt, set()).add(S.md5(h.text))
    return out


def evaluate(ctrl: Run, storm: Run, quick: bool) -> tuple[list[list], bool]:
    n = len(storm.healthy)
    during = QUICK_DURING if quick else N_DURING
    cm, sm = md5s(ctrl), md5s(storm)
    ctrl_one = {p: next(iter(v)) for p, v in cm.items() if len(v) == 1}
    same = sum(1 for h in storm.healthy if h.ok and ctrl_one.get(h.prompt) == S.md5(h.text))
    rate = lambda r: statistics.median([h.rate for h in r.healthy[:during] if h.ok] or [0.0])  # noqa: E731
    rc_, rs_ = rate(ctrl), rate(storm)
    ratio = rs_ / rc_ if rc_ else 0.0
    # Two runs one after the other on a shared box: only the full run's
    # figure is held to the goal; --quick reports it (a neighbour's load
    # between the runs would decide it).
    min_ratio = 0.0 if quick else 0.85
    fmt_set = lambda m: " ".join(sorted(x[:8] for v in m.values() for x in v))  # noqa: E731
    rows = [
        ["healthy requests completed", f"{sum(h.ok for h in ctrl.healthy)} of {n}",
         f"{sum(h.ok for h in storm.healthy)} of {n}", f"{n} of {n}"],
        ["/health probes answered 200", f"{ctrl.health.count(200)} of {len(ctrl.health)}",
         f"{storm.health.count(200)} of {len(storm.health)}", "all"],
        ["content md5s over the 4 prompts", fmt_set(cm), "identical set" if cm == sm else fmt_set(sm), "identical set"],
        ["requests equal to the control, byte for byte", "-", f"{same} of {n}", f"{n} of {n}"],
        ["healthy decode rate during storm, median tok/s", f"{rc_:.1f}", f"{rs_:.1f} ({ratio:.2f}x)",
         f">= {min_ratio:.2f}x control" if min_ratio else "report"],
        ["wedged slots seen paused at once (/slots)", "-", str(storm.paused_seen), "2 (W1)" if not quick else "report"],
        ["ring-full pauses / cancels (/metrics)", f"{ctrl.pauses:.0f} / {ctrl.cancels:.0f}",
         f"{storm.pauses:.0f} / {storm.cancels:.0f}", ">= 2 / >= 3" if not quick else "report / >= 1"],
        ["slots busy / channels leased after it all", "%.0f / %.0f" % ctrl.left_busy, "%.0f / %.0f" % storm.left_busy,
         "0 / 0"],
        ["slot erases answered 200 during the storm", "-", str(storm.erases), ">= 1"],
        ["wedges carried out (W1 x2, W2 x2, W3)", "-", f"{len(storm.wedge_notes)} of 5", "5 of 5"],
        ["exit code on SIGTERM", str(ctrl.rc), str(storm.rc), "0"],
        ["objects left in /dev/shm", str(len(ctrl.shm_left)), str(len(storm.shm_left)), "0"],
    ]
    ok = (all(h.ok for h in ctrl.healthy + storm.healthy)
          and all(c == 200 for c in ctrl.health + storm.health) and ctrl.health and storm.health
          and cm == sm and same == n and ratio >= min_ratio and storm.erases >= 1 and len(storm.wedge_notes) == 5
          and ctrl.rc == 0 and storm.rc == 0 and not ctrl.shm_left and not storm.shm_left
          and storm.cancels >= 1 and ctrl.left_busy == storm.left_busy == (0.0, 0.0))
    if not quick:
        ok = ok and storm.paused_seen >= 2 and storm.pauses >= 2 and storm.cancels >= 3
    return rows, bool(ok)


def run(quick: bool, n_predict: int | None = None, hold: float | None = None) -> dict:
    n_predict = n_predict or (8 if quick else 64)
    hold = hold or (2.5 if quick else 25.0)  # quick: the W1 figures are reported only (its ring fills after 6-7 s)
    sizes = (QUICK_DURING, QUICK_AFTER) if quick else (N_DURING, N_AFTER)
    t0 = time.monotonic()
    ctrl = one_run(False, n_predict, hold, *sizes)
    storm = one_run(True, n_predict, hold, *sizes)
    rows, ok = evaluate(ctrl, storm, quick)
    errors = [h.error for h in ctrl.healthy + storm.healthy if h.error]
    return {"ok": ok, "rows": rows, "errors": errors, "control": ctrl, "storm": storm,
            "seconds": time.monotonic() - t0, "n_predict": n_predict, "hold": hold}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="short run for the test suite (generous rate bound)")
    ap.add_argument("--n-predict", type=int, default=None)
    ap.add_argument("--hold", type=float, default=None, help="seconds the W1 wedges are held (25)")
    a = ap.parse_args()
    res = run(a.quick, a.n_predict, a.hold)
    print(f"fault storm: 8 slots, -ub 1, greedy n_predict {res['n_predict']}, wedges held {res['hold']:.0f} s, "
          f"{res['seconds']:.0f} s in all")
    print(S.table(["figure", "control", "storm", "goal"], res["rows"]))
    for e in res["errors"][:10]:
        print("error:", e)
    print("PASS" if res["ok"] else "FAIL")
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
