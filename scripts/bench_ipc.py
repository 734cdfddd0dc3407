#!/usr/bin/env python3
"""Token delivery from one producer to N readers: ringserve's channels vs baselines.

Why: llama-server sent every token through one result vector behind one
condition variable; each send woke every waiting HTTP thread, which re-took the
mutex and scanned the vector (N^2 per decode step), stalling the decode thread.
A ringserve channel is a per-request SPSC ring with its own semaphore.

This process is the producer: each step (every --interval-ms) it sends one
token to each of N readers, threads spread over --procs spawned processes.
  producer_us_per_token   wall time inside the send calls per token (decode stall)
  producer_median_...     the same from the median step (robust to other load)
  producer_cpu_...        CPU time of the sending thread inside the sends
  producer_proc_cpu_...   all producer CPU over the run (mp.Queue feeders too)
  wake_p50/p99_us         reader receive time - producer stamp (CLOCK_MONOTONIC)
  tokens_per_s            delivered / (last receive - first send)
Each (impl, N) runs --repeat times, interleaved; the run with the median
send cost is shown, with every run's figure beside it. On a VM, waking a
parked thread costs ~10-15 us on the sender (futex wake + cross-vCPU IPI,
vs ~1 us for a ring push nobody waits on): the floor of every one-wake-per-
token design here, ring and unix_socket alike.
Implementations: ring (Arena, EnginePort / WorkerPort + Lease.read);
notify_all (one mp.RawArray store behind one mp.Condition, notify_all per send,
woken readers scan for their id; note mp's notify_all also waits for every
sleeper to wake, which C++'s does not); mp_queue (one Queue per reader);
unix_socket (one SOCK_SEQPACKET socket per reader), standing in for gunicorn's
dirty arbiter, which cannot be the producer (see DIRTY_NOTE).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

from _ipc_impls import CTX, IMPLS, reader_proc, setup

DIRTY_NOTE = ("dirty: not measured. gunicorn 27.0.1's dirty arbiter queues requests per dirty worker and "
              "runs them one at a time (gunicorn/dirty/arbiter.py route_request, _start_worker_consumer), "
              "so N concurrent streams need N dirty worker processes, i.e. N producers, not one; "
              "unix_socket (one socket per reader, its transport) stands in.")


# ------------------------------------------------------------------ readers


def run(impl: str, n: int, steps: int, interval: float, procs: int, max_run_s: float, tmp: str) -> dict:
    """One implementation at one N: start readers, run the steps, collect."""
    k = min(procs, n)
    groups = [list(range(p, n, k)) for p in range(k)]
    shared, connect, cleanup = setup(impl, n, steps, groups, tmp)
    pipes, workers = [], []
    try:
        for p, ids in enumerate(groups):
            rx, tx = CTX.Pipe(duplex=False)
            arg = {r: shared[r] for r in ids} if impl == "mp_queue" else shared
            w = CTX.Process(target=reader_proc, args=(impl, p, ids, arg, tx), daemon=True)
            w.start()
            pipes.append(rx)
            workers.append(w)
        pending = set(range(k))

        def is_ready() -> bool:
            for p in list(pending):
                if pipes[p].poll():
                    pipes[p].recv()
                    pending.discard(p)
            return not pending

        send_step = connect(is_ready)
        time.sleep(0.05)  # let every reader park in its wait
        walls, cpus, full = [], [], 0
        start_ns = time.monotonic_ns()
        proc0 = time.process_time_ns()
        done = 0
        t_next = time.perf_counter()
        while done < steps:
            last = done + 1 == steps or time.monotonic_ns() - start_ns > max_run_s * 1e9
            c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
            full += send_step(done, last)
            w1, c1 = time.perf_counter_ns(), time.thread_time_ns()
            walls.append(w1 - w0)
            cpus.append(c1 - c0)
            done += 1
            if last:
                break
            t_next = max(t_next + interval, time.perf_counter())
            time.sleep(max(0.0, t_next - time.perf_counter()))
        proc_cpu = time.process_time_ns() - proc0
        results = []
        for rx in pipes:
            if not rx.poll(120):
                raise RuntimeError(f"{impl} n={n}: a reader process did not report")
            results += rx.recv()
        for w in workers:
            w.join(10)
    finally:
        for w in workers:
            if w.is_alive():
                w.kill()
                w.join()
        cleanup()
    tokens = done * n
    delivered = sum(r["count"] for r in results)
    lat = np.concatenate([r["lat"] for r in results]) / 1e3 if results else np.zeros(1)
    span = (max(r["last_ns"] for r in results) - start_ns) / 1e9
    complete = delivered == tokens and len(results) == n and all(r["bad"] == 0 for r in results)
    return {"impl": impl, "n": n, "producer_us_per_token": sum(walls) / tokens / 1e3,
            "producer_median_us_per_token": float(np.median(walls)) / n / 1e3,
            "wake_p50_us": float(np.percentile(lat, 50)), "wake_p99_us": float(np.percentile(lat, 99)),
            "tokens_per_s": delivered / span if span > 0 else 0.0,
            "producer_cpu_us_per_token": sum(cpus) / tokens / 1e3,
            "producer_proc_cpu_us_per_token": proc_cpu / tokens / 1e3,
            "steps": done, "expected": tokens, "delivered": delivered, "complete": complete, "ring_full": full}


# ------------------------------------------------------------------ report
def table(rows: list[dict]) -> str:
    """Human-readable rows; times in microseconds."""
    head = (f"{'impl':<12}{'N':>4}{'steps':>6}{'send us/tok':>12}{'median':>8}{'cpu us/tok':>11}{'proc cpu':>10}"
            f"{'wake p50':>10}{'wake p99':>10}{'tokens/s':>10}  delivered  send us/tok of each run")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['impl']:<12}{r['n']:>4}{r['steps']:>6}{r['producer_us_per_token']:>12.2f}"
                     f"{r['producer_median_us_per_token']:>8.2f}"
                     f"{r['producer_cpu_us_per_token']:>11.2f}{r['producer_proc_cpu_us_per_token']:>10.2f}"
                     f"{r['wake_p50_us']:>10.0f}{r['wake_p99_us']:>10.0f}{r['tokens_per_s']:>10.0f}"
                     f"  {r['delivered']}/{r['expected']}  "
                     + "/".join(f"{x:.0f}" for x in r["producer_us_per_token_runs"]))
    return "\n".join(lines)


def goals(rows: list[dict]) -> list[str]:
    """The targets: ring cost flat in N, and far below notify_all at N=32."""
    out = []
    for key, what in (("producer_us_per_token", "mean"), ("producer_median_us_per_token", "median step")):
        cost = {(r["impl"], r["n"]): r[key] for r in rows}
        if ("ring", 1) in cost and ("ring", 64) in cost:
            ratio = cost["ring", 64] / cost["ring", 1]
            out.append(f"goal ring N=64 / N=1 send cost ({what}) = {ratio:.2f} (want <= 1.5): "
                       f"{'MET' if ratio <= 1.5 else 'MISSED'}")
        if ("ring", 32) in cost and ("notify_all", 32) in cost:
            ratio = cost["notify_all", 32] / cost["ring", 32]
            out.append(f"goal notify_all / ring at N=32 ({what}) = {ratio:.1f}x (want >= 10): "
                       f"{'MET' if ratio >= 10 else 'MISSED'}")
    return out


def plot(rows: list[dict], path: str) -> None:
    """Per-token producer cost vs N, log-log (the O(1) vs O(N) picture)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for impl in IMPLS:
        pts = sorted((r["n"], r["producer_us_per_token"]) for r in rows if r["impl"] == impl)
        if pts:
            ax.plot(*zip(*pts), marker="o", label=impl)
    ax.set_xscale("log", base=2)
    ax.set(yscale="log", xlabel="readers N (one token each per step)", ylabel="producer time in send, us per token",
           title="Engine-side cost of delivering one token")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ns", default="1,4,16,32,64", help="reader counts, comma separated")
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=3, help="runs per (impl, N), interleaved; the median run is shown")
    ap.add_argument("--interval-ms", type=float, default=2.0, help="decode step interval")
    ap.add_argument("--procs", type=int, default=2, help="reader processes (gunicorn workers)")
    ap.add_argument("--max-run-s", type=float, default=6.0, help="cap on one run's steps phase")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument("--plot", metavar="PNG")
    ap.add_argument("--quick", action="store_true", help="N=1,4, 20 steps, once; fail unless every token arrives")
    args = ap.parse_args()
    ns = [1, 4] if args.quick else [int(x) for x in args.ns.split(",")]
    steps, repeat = (20, 1) if args.quick else (args.steps, args.repeat)
    runs: dict[tuple[str, int], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-ipc-") as tmp:
        for rep in range(repeat):  # interleaved, so load from elsewhere hits every impl alike
            for n in ns:
                for impl in args.impls.split(","):
                    r = run(impl, n, steps, args.interval_ms / 1e3, args.procs, args.max_run_s, tmp)
                    runs.setdefault((impl, n), []).append(r)
                    if not args.json:
                        print(f"  run {rep + 1}/{repeat} {impl} N={n}", file=sys.stderr, flush=True)
    rows = []
    for rs in runs.values():
        rs = sorted(rs, key=lambda r: r["producer_us_per_token"])
        row = dict(rs[len(rs) // 2])
        row["producer_us_per_token_runs"] = [round(r["producer_us_per_token"], 2) for r in rs]
        row["complete"] = all(r["complete"] for r in rs)
        rows.append(row)
    if args.json:
        print(DIRTY_NOTE, file=sys.stderr)
        print(json.dumps({"rows": rows}))
    else:
        print(f"producer: 1 process, step every {args.interval_ms} ms; readers: threads over "
              f"{args.procs} processes; times in us; {os.cpu_count()} CPUs")
        print(table(rows))
        if goals(rows):
            print("\n".join(goals(rows)))
        print(DIRTY_NOTE)
    if args.plot:
        plot(rows, args.plot)
    bad = [f"{r['impl']} N={r['n']}: {r['delivered']}/{r['expected']}" for rs in runs.values() for r in rs
           if not r["complete"]]
    if bad:
        print("INCOMPLETE: " + "; ".join(bad), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
