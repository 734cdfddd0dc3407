#!/usr/bin/env python
"""Where each server's memory goes: RSS, PSS and USS per process, and the
engine's (or llama-server's) mappings by kind, idle after start and at the
peak of one bench_cache workload.

Why PSS is the figure to compare: scripts/_treemem.py. The mapping tables
name what each process holds: the mmapped GGUF, the brk heap (libllama's
vocabulary and Python), llama.cpp's buffers (KV, compute, output, repacked
weights: one anonymous mapping each, or adjacent ones merged), small
anonymous mappings (Python's object arenas, numpy, thread malloc arenas),
shared libraries and the arena's shared memory.

  python scripts/mem_breakdown.py --workload chat --quick
  python scripts/mem_breakdown.py --workload chat            # bench_cache's full size
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time

import psutil

import _cache_workloads as W
from _treemem import MiB, ROLLUP, rollup
from bench_servers import LlamaServer, Ringserve, Running, Settings, llama_server_path
from bench_serving import MODES, default_model
from frontends.testing import procs


def mappings(pid: int) -> list[dict]:
    """/proc/PID/smaps: one dict per mapping (start, size, name, Rss, Pss, ...)."""
    out, cur = [], None
    head = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ \S+\s*(.*)$")
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            m = head.match(line)
            if m:
                cur = {"start": int(m[1], 16), "size": int(m[2], 16) - int(m[1], 16), "perms": m[3],
                       "name": m[4].strip()}
                out.append(cur)
                continue
            k, _, v = line.partition(":")
            if cur is not None and k in ROLLUP:
                cur[k] = int(v.split()[0]) * 1024
    return out


def kind(m: dict) -> str:
    n = m["name"]
    if n.endswith(".gguf"):
        return "model file (mmap)"
    if n.startswith("/dev/shm/") or n.startswith("/rs_"):
        return "arena shm"
    if ".so" in n:
        return "shared libraries"
    if n == "[heap]":
        return "brk heap (malloc)"
    if n.startswith("[stack"):
        return "stacks"
    if n.startswith("["):
        return "other [" + n.strip("[]") + "]"
    if n:
        return "other files"
    if m["size"] >= 8 * MiB:  # llama.cpp's buffers (KV, compute, output, repack) are one mapping each
        return f"anon {m['size'] / MiB:.1f} MiB mapping"
    return "anon < 8 MiB (malloc arenas, thread stacks, numpy)"


def by_kind(pid: int) -> dict[str, dict[str, int]]:
    agg: dict[str, dict[str, int]] = {}
    for m in mappings(pid):
        a = agg.setdefault(kind(m), {"Rss": 0, "Pss": 0, "Uss": 0, "size": 0})
        a["Rss"] += m.get("Rss", 0)
        a["Pss"] += m.get("Pss", 0)
        a["Uss"] += m.get("Private_Clean", 0) + m.get("Private_Dirty", 0)
        a["size"] += m["size"]
    return agg


def role_of(root: int, p: psutil.Process, ringserve: bool) -> str:
    if not ringserve:
        return "llama-server"
    if p.pid == root:
        return "launcher"
    try:
        if p.ppid() != root:
            return "worker"  # forked by the gunicorn master: its cmdline is the master's
        return "gunicorn master" if procs.is_master(" ".join(p.cmdline())) else "engine"
    except psutil.NoSuchProcess:
        return "gone"


def snapshot(root: int, ringserve: bool) -> list[dict]:
    rows = []
    for p in procs.tree(root):
        try:
            r = rollup(p.pid)
            rows.append({"pid": p.pid, "role": role_of(root, p, ringserve), **r})
        except (FileNotFoundError, ProcessLookupError, psutil.NoSuchProcess):
            pass
    return rows


def total(rows: list[dict], k: str) -> int:
    return sum(r.get(k, 0) for r in rows)


def print_procs(title: str, rows: list[dict], out) -> None:
    print(f"\n{title}\n", file=out)
    print("| process | pid | RSS MiB | PSS MiB | USS MiB | shared MiB | anon MiB |", file=out)
    print("|---|---|---|---|---|---|---|", file=out)
    order = {"launcher": 0, "engine": 1, "gunicorn master": 2, "worker": 3, "llama-server": 0}
    for r in sorted(rows, key=lambda r: (order.get(r["role"], 9), r["pid"])):
        sh = r.get("Shared_Clean", 0) + r.get("Shared_Dirty", 0)
        print(f"| {r['role']} | {r['pid']} | {r['Rss'] / MiB:.1f} | {r['Pss'] / MiB:.1f} | {r['Uss'] / MiB:.1f} "
              f"| {sh / MiB:.1f} | {r.get('Anonymous', 0) / MiB:.1f} |", file=out)
    print(f"| **sum** | | {total(rows, 'Rss') / MiB:.1f} | {total(rows, 'Pss') / MiB:.1f} "
          f"| {total(rows, 'Uss') / MiB:.1f} | | {total(rows, 'Anonymous') / MiB:.1f} |", file=out)


def print_kinds(title: str, agg: dict[str, dict[str, int]], out) -> None:
    print(f"\n{title}\n", file=out)
    print("| mapping | mapped MiB | RSS MiB | PSS MiB | USS MiB |", file=out)
    print("|---|---|---|---|---|", file=out)
    for k, a in sorted(agg.items(), key=lambda kv: -kv[1]["Pss"]):
        if a["Rss"] < 0.05 * MiB:
            continue
        print(f"| {k} | {a['size'] / MiB:.1f} | {a['Rss'] / MiB:.1f} | {a['Pss'] / MiB:.1f} | {a['Uss'] / MiB:.1f} |",
              file=out)


def measure(srv, st: Settings, w: W.Workload, tok: W.Tokens, args, out) -> dict:
    ringserve = srv.name == "ringserve"
    with Running(srv, st) as run:
        try:
            root = run.proc.pid
            time.sleep(args.settle)
            big = lambda rows: max(rows, key=lambda r: r["Pss"])["pid"]  # noqa: E731  (engine / llama-server)
            idle = snapshot(root, ringserve)
            print(f"\n## {srv.name}: {' '.join(run.cmd[1:])}", file=out)
            print_procs(f"{srv.name} idle, {args.settle:.0f} s after ready", idle, out)
            eng = big(idle)
            for r in sorted(idle, key=lambda r: -r["Pss"]) if args.all_kinds else [r for r in idle if r["pid"] == eng]:
                print_kinds(f"{srv.name} idle: mappings of pid {r['pid']} ({r['role']})", by_kind(r["pid"]), out)
            peak = {"pss": 0, "rows": idle, "kinds": None}
            halt = threading.Event()

            def sampler() -> None:
                while not halt.is_set():
                    rows = snapshot(root, ringserve)
                    s = total(rows, "Pss")
                    if s > peak["pss"]:
                        peak.update(pss=s, rows=rows, kinds=by_kind(big(rows)))
                    halt.wait(args.every)

            th = threading.Thread(target=sampler, daemon=True)
            th.start()
            recs, wall = W.run(run.port, w, tok, 600.0, MODES["greedy"])
            halt.set()
            th.join()
            ok = sum(r["ok"] for r in recs)
            print_procs(f"{srv.name} at the peak of the tree's PSS sum during {w.name} "
                        f"({ok}/{len(recs)} ok, {wall:.1f} s)", peak["rows"], out)
            print_kinds(f"{srv.name} at that peak: mappings of its biggest process", peak["kinds"] or {}, out)
            return {"server": srv.name, "requests": len(recs), "ok": ok, "idle": idle, "peak": peak["rows"],
                    "peak_kinds": peak["kinds"] or {}}
        finally:
            problems = run.stop()
            for p in problems:
                print(f"problem: {p}", file=out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", default="")
    p.add_argument("--workload", default="chat", choices=("chat", "chat64", "prefix", "agents", "unique"))
    p.add_argument("--quick", action="store_true", help="bench_cache --quick's sizes")
    p.add_argument("-c", "--ctx-per-slot", type=int, default=0, help="default: bench_cache's (1024 quick, 4096)")
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--servers", default="ringserve,llama-server")
    p.add_argument("--ringserve-args", default="")
    p.add_argument("--settle", type=float, default=None,
                   help="seconds after ready before the idle snapshot (default 3; --quick: 1)")
    p.add_argument("--every", type=float, default=0.25)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--all-kinds", action="store_true", help="idle mapping table of every process, not only the biggest")
    p.add_argument("--json", action="store_true", help="JSON on stdout (the tables go to stderr)")
    args = p.parse_args(argv)
    if args.settle is None:
        args.settle = 1.0 if args.quick else 3.0
    model = args.model or default_model()
    ctx = args.ctx_per_slot or (1024 if args.quick else 4096)
    w = W.build(args.workload, args.quick, args.seed, {"chat_convs": 16, "chat_turns": 4})
    st = Settings(model=model, slots=w.slots, ctx=w.slots * ctx, threads=args.threads, flash_attn="auto")
    servers = []
    for name in args.servers.split(","):
        if name == "ringserve":
            servers.append(Ringserve(args.ringserve_args.split()))
        elif name == "llama-server" and llama_server_path():  # scripts/build_llama_server.sh's
            servers.append(LlamaServer(llama_server_path(), []))
    out = sys.stderr if args.json else sys.stdout
    tok = W.Tokens(model)
    runs = []
    try:
        for srv in servers:
            w = W.build(args.workload, args.quick, args.seed, {"chat_convs": 16, "chat_turns": 4})
            runs.append(measure(srv, st, w, tok, args, out))
    finally:
        tok.close()
    ok = bool(runs) and all(r["ok"] == r["requests"] > 0 for r in runs)
    if args.json:
        json.dump({"ok": ok, "model": model, "workload": args.workload, "quick": args.quick, "runs": runs},
                  sys.stdout, indent=1)
        print()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
