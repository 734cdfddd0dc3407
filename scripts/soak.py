#!/usr/bin/env python3
"""Memory under disconnect churn: does any process grow per request once warm?

8 clients at a time send streaming /completion requests and drop each one
(RST) after a random 0.5-1.5 s, mid-generation: --warmup requests, then N
more (default 10,000, about 22 minutes here). The RSS of every process of the
tree (launcher, engine, gunicorn master, each worker) is sampled every few
requests while the churn runs, and at --marks settled points (every slot
idle, no channel leased) between which the churn pauses.

Figures (the issue 18 goal):

* per process, the slope over the second half: a least-squares fit of the
  RSS samples against requests done, in bytes per request once warm
  (goal < 100 B each);
* the whole tree's settled RSS at the end minus at the half (goal < 1 MB);
* nothing of the instance left in /dev/shm after SIGTERM;
* the prefix cache's host-RAM tier (`--cache-ram`, here --cache-ram MiB,
  default 8) stays within its bound at every mark and takes nothing of the
  dropped requests: an abandoned stream keeps only its prompt in its slot
  and is never saved to RAM (issue 24; before, every dropped request's KV
  went to RAM when its slot was reused, and at the default 8 GiB bound the
  tree grew by ~334 kB a request). scripts/bench_drop.py --complete shows
  the tier filling to its bound with answered requests and staying there.

A table of settled RSS per process at each mark shows where allocator growth
levels off. Start-to-end growth per request and per generated token (the
seed's method: llama-server grew ~6.8 kB per generated token, ~550 kB per
request, in its host-memory prompt cache) are printed too.

--trace DIR runs the tree with RINGSERVE_TRACEMALLOC=DIR (engine/memtrace.py):
at each mark every process dumps tracemalloc and glibc figures, and the
script prints, per process, what grew over the second half (Python objects
traced, malloc in use, malloc free inside arenas) and the source lines that
grew most. Tracing slows the server; take RSS slopes from untraced runs.

The client is one thread over non-blocking sockets (selectors): it shares the
machine's cores with the server and must not distort it.

Usage: python scripts/soak.py [N] [--warmup W] [--marks M] [--env K=V]
       [--trace DIR] [--plot PNG] [--json FILE] [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import selectors
import socket
import sys
import time

from frontends import testing as S

from engine import memtrace

FLAGS = ("-c", "4096", "-np", "8", "-t", "2", "-w", "2", "--threads-http", "16", "--metrics")
WORDS = ("river", "garden", "harbour", "forest", "castle", "island", "market", "valley")
GOAL_SLOPE_B = 100  # bytes per request, each process, second half
GOAL_TREE_KB = 1024  # whole tree, second half
QUICK_SLOPE_B = 100 * 1024  # --quick: 60 requests cannot resolve 100 B; it checks the plumbing


class Churn:
    """``width`` streaming requests in flight from one thread; each is
    dropped with an RST ``keep`` seconds (0.5-1.5) after it was sent."""

    def __init__(self, port: int, width: int, seed: int, on_done=None):
        self.port, self.width = port, width
        self.rng = random.Random(seed)
        self.sel = selectors.DefaultSelector()
        self.on_done = on_done or (lambda: None)
        self.stats = {"requests": 0, "bytes": 0, "answered": 0, "failed": 0}
        self.done = 0
        self.buf = bytearray(65536)
        self.n_predict = 100000  # fewer: the server ends a request before its drop time (bench_drop --complete)
        self.keep = (0.5, 1.5)  # seconds after which a request is dropped
        self.doc_words = 0  # > 0: each prompt opens with a unique document of this many words (bench_drop --kept)

    def _open(self) -> None:
        rng = self.rng
        doc = (f"Document {rng.randrange(10**9)}: " + " ".join(rng.choice(WORDS) for _ in range(self.doc_words))
               + "\n") if self.doc_words else ""
        body = {"prompt": f"{doc}Tell a long story about the {rng.choice(WORDS)} number {rng.randrange(10**6)}.",
                "n_predict": self.n_predict, "stream": True}
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=30)
            s.sendall(S.raw_request("/completion", body))
            s.setblocking(False)
        except OSError:
            self.stats["failed"] += 1
            self.stats["requests"] += 1
            self.done += 1
            self.on_done()
            return
        self.sel.register(s, selectors.EVENT_READ, [time.monotonic() + rng.uniform(*self.keep), 0])

    def _close(self, s: socket.socket, st: list) -> None:
        self.sel.unregister(s)
        S.reset_close(s)
        self.stats["requests"] += 1
        self.stats["bytes"] += st[1]
        self.stats["answered"] += st[1] > 0
        self.done += 1
        self.on_done()

    def run(self, n: int) -> None:
        """Send n requests, ``width`` at a time; return once all are dropped."""
        sent = 0
        while sent < n or self.sel.get_map():
            while sent < n and len(self.sel.get_map()) < self.width:
                self._open()
                sent += 1
            now = time.monotonic()
            keys = list(self.sel.get_map().values())
            if not keys:
                continue
            first = min(k.data[0] for k in keys)
            for key, _ in self.sel.select(max(first - now, 0.0)):
                s, st = key.fileobj, key.data
                try:
                    while True:
                        k = s.recv_into(self.buf)
                        if k == 0:  # the server ended it: the request still counts as sent
                            st[0] = 0.0
                            break
                        st[1] += k
                except BlockingIOError:
                    pass
                except OSError:
                    st[0] = 0.0
            now = time.monotonic()
            for key in list(self.sel.get_map().values()):
                if key.data[0] <= now:
                    self._close(key.fileobj, key.data)


def settle(srv: S.Server, timeout: float = 30.0) -> bool:
    """Wait until every slot is idle and no channel is leased."""
    def idle() -> bool:
        m = S.metrics(srv.base)
        return m.get("ringserve:slots_busy") == 0 and m.get("ringserve:channels_leased") == 0
    try:
        return S.wait_for(idle, timeout, "idle", step=0.1)
    except TimeoutError:
        return False


class Tree:
    """The processes measured: names -> pids, fixed at the start."""

    def __init__(self, srv: S.Server):
        self.pids = {"launcher": srv.proc.pid, "engine": srv.engine_pid, "master": srv.master_pid}
        for i, p in enumerate(srv.worker_pids()):
            self.pids[f"worker {i + 1}"] = p

    def rss(self) -> dict[str, int]:
        return {k: S.rss_kb(p) for k, p in self.pids.items()}


def dump_traces(tree: Tree, out: str, k: int, timeout: float = 60.0) -> bool:
    """Ask every process for its k-th memtrace dump and wait until all wrote it."""
    for p in tree.pids.values():
        os.kill(p, memtrace.SIGNAL)

    def lines(p: int) -> int:
        n = 0
        for f in os.listdir(out):
            if f.endswith(f"-{p}.jsonl"):
                with open(os.path.join(out, f)) as fh:
                    n = sum(1 for _ in fh)
        return n
    return S.wait_for(lambda: all(lines(p) > k for p in tree.pids.values()), timeout, 0.2) is not None


def run(n: int, warmup: int, marks: int, width: int = 8, env: dict | None = None, trace: str = "",
        cache_ram: int = 8, keep: tuple[float, float] = (0.5, 1.5)) -> dict:
    env = dict(env or {})
    if trace:
        os.makedirs(trace, exist_ok=True)
        env[memtrace.ENV] = trace
    srv = S.Server(*FLAGS, "--cache-ram", str(cache_ram), env=env, ready_timeout=120.0 if trace else 60.0)
    samples: list[tuple[int, dict]] = []  # (requests done after warm-up, RSS kB per process)
    settled: list[dict] = []
    every = max(1, n // 400)
    traced = True
    try:
        warm = Churn(srv.port, width, 1)
        warm.keep = keep
        warm.run(warmup)
        settle(srv)
        tree = Tree(srv)
        sent = {"requests": 0, "bytes": 0, "answered": 0, "failed": 0}
        done = 0

        def mark() -> None:
            nonlocal traced
            m = S.metrics(srv.base)
            settled.append({"done": done, "rss": tree.rss(), "t": time.monotonic(),
                            "tokens": m.get("llamacpp:tokens_predicted_total", 0.0),
                            "requests": m.get("ringserve:requests_total", 0.0),
                            "cancels": m.get("ringserve:cancels_total", 0.0),
                            "ram_bytes": m.get("ringserve:cache_ram_bytes", 0.0),
                            "ram_saves": m.get("ringserve:cache_ram_saves_total", 0.0)})
            samples.append((done, settled[-1]["rss"]))
            if trace:
                traced = dump_traces(tree, trace, len(settled) - 1) and traced

        mark()
        for i in range(marks):
            k = n * (i + 1) // marks - done
            base = done

            def on_done(c: list = [0]) -> None:  # noqa: B006 - a per-chunk counter
                c[0] += 1
                if c[0] % every == 0:
                    samples.append((base + c[0], tree.rss()))
            churn = Churn(srv.port, width, 2 + i, on_done)
            churn.keep = keep
            churn.run(k)
            for key in sent:
                sent[key] += churn.stats[key]
            done += k
            idle = settle(srv)
            mark()
        workers_same = {p for k, p in tree.pids.items() if k.startswith("worker")} == set(srv.worker_pids())
    finally:
        rc, left = srv.finish()
    return {"n": n, "warmup": warmup, "marks": settled, "cache_ram": cache_ram, "samples": samples, "sent": sent, "idle": idle, "rc": rc,
            "workers_same": workers_same, "shm_left": left, "names": list(tree.pids), "traced": traced,
            "trace": trace, "pids": tree.pids}


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares slope of ys on xs and its standard error."""
    k = len(xs)
    if k < 3:
        return 0.0, float("inf")
    mx, my = sum(xs) / k, sum(ys) / k
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return 0.0, float("inf")
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    resid = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys))
    return b, (resid / (k - 2) / sxx) ** 0.5


def analyse(res: dict) -> dict:
    """Second-half slopes (B/request), settled growth, whole-run figures."""
    n, names, marks = res["n"], res["names"], res["marks"]
    half = [(d, r) for d, r in res["samples"] if d >= n / 2]
    out: dict = {"slope": {}, "err": {}}
    for name in names + ["tree"]:
        xs = [d for d, _ in half]
        ys = [(sum(r.values()) if name == "tree" else r[name]) * 1024 for _, r in half]
        out["slope"][name], out["err"][name] = fit(xs, ys)
    mid = min(marks, key=lambda m: abs(m["done"] - n / 2))
    a, b = marks[0], marks[-1]
    out["mid"], out["first"], out["last"] = mid, a, b
    out["tree_half_kb"] = sum(b["rss"].values()) - sum(mid["rss"].values())
    out["tokens"] = max(b["tokens"] - a["tokens"], 1.0)
    return out


def report(res: dict, an: dict) -> str:
    n = max(res["sent"]["requests"], 1)
    names = res["names"]
    a, mid, b = an["first"], an["mid"], an["last"]
    rows = []
    for name in names + ["tree"]:
        rss = (lambda m: sum(m["rss"].values())) if name == "tree" else (lambda m, k=name: m["rss"][k])  # noqa: E731
        g2, g = rss(b) - rss(mid), rss(b) - rss(a)
        rows.append([name, f"{rss(a):,}", f"{rss(mid):,}", f"{rss(b):,}", f"{g2:+,}",
                     f"{an['slope'][name]:+.1f} ± {an['err'][name]:.1f}", f"{g * 1024 / n:+.0f}",
                     f"{g * 1024 / an['tokens']:+.2f}"])
    text = [S.table(["process", "RSS warm kB", f"at {mid['done']} kB", f"at {b['done']} kB", "2nd half kB",
                     "2nd-half slope B/req", "whole run B/req", "B/token"], rows)]
    level = [[f"{m['done']:,}"] + [f"{m['rss'][k]:,}" for k in names] + [f"{sum(m['rss'].values()):,}"]
             for m in res["marks"]]
    text += ["", "settled RSS kB at each mark (requests done after warm-up):",
             S.table(["requests"] + names + ["tree"], level)]
    reqs = b["requests"] - a["requests"]
    text += ["", f"requests dropped after 0.5-1.5 s: {n} (client; {res['sent']['failed']} failed to send), "
             f"{reqs:.0f} reached the engine, {b['cancels'] - a['cancels']:.0f} cancelled by disconnect; "
             f"tokens generated (server): {an['tokens']:,.0f} ({an['tokens'] / n:.1f} per request); "
             f"{b['t'] - a['t']:.0f} s",
             f"host-memory prompt cache: bounded by --cache-ram {res['cache_ram']} MiB (the slots' KV is allocated "
             "once in the llama context)",
             f"idle at the end: {res['idle']}; same workers throughout: {res['workers_same']}; "
             f"exit on SIGTERM: {res['rc']}; /dev/shm left: {len(res['shm_left'])}"]
    return "\n".join(text)


def trace_report(res: dict) -> str:
    """What grew per process between the mid and the last dump, by kind."""
    out, k_mid = res["trace"], len(res["marks"]) // 2
    rows, tops = [], []
    for name, pid in res["pids"].items():
        path = next((os.path.join(out, f) for f in os.listdir(out) if f.endswith(f"-{pid}.jsonl")), None)
        if path is None:
            continue
        with open(path) as f:
            recs = [json.loads(line) for line in f if line.strip()]
        recs = [r for r in recs if r["why"] == "signal"]
        if len(recs) < 2:
            continue
        m, z = recs[min(k_mid, len(recs) - 1)], recs[-1]

        def d(key: str, div: int = 1024) -> str:
            return f"{(z[key] - m[key]) / div:+,.0f}"
        rows.append([name, d("rss_kb", 1), d("anon_kb", 1), d("traced"), d("malloc_used"), d("malloc_free"),
                     f"{m['arenas']}->{z['arenas']}", f"{m['threads']}->{z['threads']}", d("blocks", 1)])
        for t in z["top"][:5]:
            tops.append(f"  {name}: {t['size']:+,} B {t['count']:+,} blocks  {t['where']}")
    return "\n".join(["second half, per process (kB unless noted; from memtrace dumps at the marks):",
                      S.table(["process", "RSS", "anon", "traced", "malloc used", "malloc free", "arenas",
                               "threads", "pymalloc blocks"], rows),
                      "", "source lines grown most since the warm mark (tracemalloc):"] + tops)


def plot(res: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = res["names"]
    fig, axes = plt.subplots(len(names), 1, figsize=(8, 1.9 * len(names)), sharex=True)
    for ax, name in zip(axes, names):
        xs = [d for d, _ in res["samples"]]
        ax.plot(xs, [r[name] / 1024 for _, r in res["samples"]], lw=0.8)
        ax.plot([m["done"] for m in res["marks"]], [m["rss"][name] / 1024 for m in res["marks"]], "o", ms=3)
        ax.ticklabel_format(axis="y", useOffset=False)
        ax.set_ylabel(f"{name}\nRSS MiB", fontsize=8)
        ax.axvline(res["n"] / 2, color="grey", lw=0.5, ls="--")
    axes[-1].set_xlabel("requests dropped after warm-up (dots: settled marks; dashed: second half starts)")
    fig.suptitle("ringserve RSS per process under disconnect churn", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("n", type=int, nargs="?", default=10000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--marks", type=int, default=10, help="settled points (even: one falls at the half)")
    ap.add_argument("--env", action="append", default=[], metavar="K=V", help="extra server environment")
    ap.add_argument("--trace", default="", metavar="DIR", help="memtrace dumps at each mark into DIR")
    ap.add_argument("--malloc-only", action="store_true",
                    help="with --trace: allocator figures only, tracemalloc off (RINGSERVE_TRACEMALLOC_FRAMES=0)")
    ap.add_argument("--plot", default="", metavar="PNG")
    ap.add_argument("--json", default="", metavar="FILE", help="raw samples and marks")
    ap.add_argument("--quick", action="store_true", help="60 requests after 16 of warm-up, dropped after 0.25-0.75 s, generous bound")
    ap.add_argument("--cache-ram", type=int, default=8, metavar="MiB", help="the server's host-RAM KV tier bound")
    a = ap.parse_args()
    n, warm, marks = (60, 16, 2) if a.quick else (a.n, a.warmup, max(2, a.marks + a.marks % 2))
    env = dict(kv.split("=", 1) for kv in a.env)
    if a.malloc_only:
        env[memtrace.FRAMES_ENV] = "0"
    # --quick drops each request after 0.25-0.75 s (still mid-generation): half the wall time of 0.5-1.5 s
    keep = (0.25, 0.75) if a.quick else (0.5, 1.5)
    res = run(n, warm, marks, env=env, trace=a.trace, cache_ram=a.cache_ram, keep=keep)
    an = analyse(res)
    print(f"soak: {n} streaming requests dropped mid-generation, 8 at a time, after {warm} of warm-up"
          + (f"; server env {' '.join(a.env)}" if a.env else "") + (" (traced)" if a.trace else ""))
    print(report(res, an))
    if a.trace:
        print()
        print(trace_report(res))
    if a.plot:
        plot(res, a.plot)
        print(f"plot: {a.plot}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({**res, "analysis": {k: v for k, v in an.items() if k in ("slope", "err", "tree_half_kb")}},
                      f)
    ram = [m["ram_bytes"] for m in res["marks"]]
    saves = res["marks"][-1]["ram_saves"] - res["marks"][0]["ram_saves"]
    ram_ok = max(ram) <= a.cache_ram * 2**20 and saves == 0  # abandoned streams never reach RAM
    print(f"host-RAM KV tier (--cache-ram {a.cache_ram} MiB): {saves:.0f} saves after warm-up, bytes at each mark "
          + ", ".join(f"{b / 2**20:.2f} MiB" for b in ram)
          + f": {'within the bound, nothing of the dropped streams' if ram_ok else 'NOT as it should be'}")
    bound = QUICK_SLOPE_B if a.quick else GOAL_SLOPE_B
    worst = max(an["slope"][k] for k in res["names"])
    ok = (res["idle"] and res["rc"] == 0 and not res["shm_left"] and res["sent"]["answered"] > 0
          and res["workers_same"] and res["sent"]["requests"] >= res["n"] and res["traced"]
          and worst < bound and (a.quick or an["tree_half_kb"] < GOAL_TREE_KB) and ram_ok)
    print(f"goal: over the second half every process under {bound} B per request (worst {worst:+.1f})"
          + ("" if a.quick else f" and the tree under {GOAL_TREE_KB} kB ({an['tree_half_kb']:+,} kB)")
          + f", nothing left in /dev/shm: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
