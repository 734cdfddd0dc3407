#!/usr/bin/env python
"""Prompt admission rules side by side: ringserve with --admit fair, fifo and
srf, alternating per round (A B C A B C), on the workloads where waiting
prompts compete for a step's room (issue 24):

  burst   --burst-count equal prompts of --burst-size tokens sent at once
          (-np count + 2) while 2 users stream (bench_mixed with interval 0);
  mixed   bench_mixed's shape: 8 streamers, 1k/4k-token prompts every 8 s;
  prefix  bench_cache's shared documents (8 x 16 questions);
  chat    bench_cache's chat (16 conversations x 4 turns).

Reported per workload and rule: mean and p50 TTFT of the prompts that
compete (burst and mixed: the long prompts; prefix and chat: every request,
and the first turn's p50), the streamers' ITL p50 / p99 (burst, mixed) and
the wall time (prefix, chat). Medians over rounds.

  python scripts/bench_admit.py                       # all, 1 round (~9 min)
  python scripts/bench_admit.py --workloads burst --rounds 2
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from types import SimpleNamespace

import _cache_workloads as W
import bench_cache
import bench_mixed
from bench_mixed import f, med
from bench_servers import Ringserve, Settings
from bench_serving import _clean, bench_setup, default_model

RULES = ("fair", "fifo", "srf")
ALL = ("burst", "mixed", "prefix", "chat")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a = p.add_argument
    a("-m", "--model", default="")
    a("--workloads", default=",".join(ALL))
    a("--rules", default=",".join(RULES))
    a("--rounds", type=int, default=1)
    a("--burst-count", type=int, default=4)
    a("--burst-size", type=int, default=1500)
    a("--mixed-longs", type=int, default=4, help="long prompts per mixed run")
    a("-t", "--threads", type=int, default=2)
    a("--ringserve-args", default="", help="extra ringserve flags for every rule")
    a("--timeout", type=float, default=300.0)
    a("--json", action="store_true")
    a("--quick", action="store_true", help="tiny sizes: completeness only")
    args = p.parse_args(argv)
    args.names = [w for w in args.workloads.split(",") if w]
    args.rules = [r for r in args.rules.split(",") if r]
    if args.quick:  # 2 prompts still compete for the same step's room (mixed_args)
        args.burst_count = min(args.burst_count, 2)
    return args


def mixed_args(args, burst: bool) -> SimpleNamespace:
    m = bench_mixed.parse_args(["--quick"] if args.quick else [])
    if burst:
        # --quick: 2 prompts of 300 tokens still compete for the same step's room, after 0.5 s of streaming;
        # the streamers' requests are 16 tokens (they stream back to back, so still beside the prompts, and
        # the run's end waits for their last request only)
        count = args.burst_count
        m.streamers, m.long_count, m.interval, m.lead = 2, count, 0.0, 1.0 if not args.quick else 0.5
        m.stream_gen = 64 if not args.quick else 16
        m.sizes = [args.burst_size if not args.quick else 300]
        m.slots = count + 2
    elif not args.quick:
        m.long_count = args.mixed_longs
    m.threads, m.timeout = args.threads, args.timeout
    m.ctx_size = m.slots * 4096 if not args.quick else m.slots * 1024
    return m


def run_mixed(rule: str, args, model: str, burst: bool, rnd: int, bar, problems) -> dict:
    m = mixed_args(args, burst)
    longs = bench_mixed.long_prompts(model, m.sizes, m.long_count)
    st = Settings(model=model, slots=m.slots, ctx=m.ctx_size, threads=m.threads, flash_attn="auto")
    srv = Ringserve(["--admit", rule] + args.ringserve_args.split())
    r = bench_mixed.one_run(srv, st, m, longs, rnd, bar, problems, {})
    tt = [x for v in r["long_ttft_ms"].values() for x in v]
    return {"ttft_mean": sum(tt) / len(tt) if tt else math.nan, "ttft_p50": med(tt), "first_p50": math.nan,
            "itl_p50": r["itl_ms"]["p50"], "itl_p99": r["itl_ms"]["p99"], "wall": r["window_s"]}


def run_cache(rule: str, name: str, args, model: str, tok, rnd: int, bar, problems) -> dict:
    c = SimpleNamespace(quick=args.quick, seed=1234, chat_convs=16, chat_turns=4, threads=args.threads,
                        ctx_per_slot=1024 if args.quick else 4096, flash_attn="auto", timeout=args.timeout,
                        mem_every=bench_cache.MEM_EVERY)
    srv = Ringserve(["--admit", rule] + args.ringserve_args.split())
    r = bench_cache.one_run(srv, model, c, name, rnd, tok, bar, problems, {})
    tt = [x["ttft"] * 1e3 for x in r["records"] if x["ok"]]
    return {"ttft_mean": sum(tt) / len(tt) if tt else math.nan, "ttft_p50": med(tt),
            "first_p50": r["ttft_first_p50"], "itl_p50": math.nan, "itl_p99": math.nan, "wall": r["wall_s"],
            "eval_floor": r["evaluated"] / max(r["floor"], 1)}


def main(argv=None) -> int:
    args = parse_args(argv)
    tqdm = bench_setup()
    model = args.model or default_model()
    tok = W.Tokens(model)
    bar = tqdm(total=0, file=sys.stderr, mininterval=1.0, dynamic_ncols=True)
    rows: list[dict] = []
    problems: list[str] = []
    try:
        for name in args.names:
            for rnd in range(args.rounds):
                for rule in args.rules:
                    bar.set_description(f"{name} r{rnd + 1} --admit {rule}")
                    if name in ("burst", "mixed"):
                        r = run_mixed(rule, args, model, name == "burst", rnd, bar, problems)
                    else:
                        r = run_cache(rule, name, args, model, tok, rnd, bar, problems)
                    rows.append({"workload": name, "rule": rule, "round": rnd, **r})
    finally:
        bar.close()
        tok.close()
    out = sys.stderr if args.json else sys.stdout
    print(f"\n--admit rules, ringserve alone, {args.rounds} round(s) alternating; TTFT and ITL in ms (burst: "
          f"{args.burst_count} x {args.burst_size} tokens at once beside 2 streamers; mixed: the long prompts' TTFT, "
          "8 streamers' ITL; prefix/chat: every request's TTFT)\n", file=out)
    print("| workload | rule | TTFT mean | TTFT p50 | first-turn TTFT p50 | ITL p50 | ITL p99 | wall s | eval÷floor |",
          file=out)
    print("|---|---|---|---|---|---|---|---|---|", file=out)
    for name in args.names:
        for rule in args.rules:
            rs = [r for r in rows if r["workload"] == name and r["rule"] == rule]
            if not rs:
                continue
            g = lambda k: med([r.get(k, math.nan) for r in rs])  # noqa: E731
            print(f"| {name} | {rule} | {f(g('ttft_mean'))} | {f(g('ttft_p50'))} | {f(g('first_p50'))} "
                  f"| {f(g('itl_p50'))} | {f(g('itl_p99'))} | {f(g('wall'), '.1f')} | {f(g('eval_floor'), '.2f')} |",
                  file=out)
    for pr in problems:
        print(f"problem: {pr}", file=out)
    if args.json:
        json.dump(_clean({"ok": not problems, "rows": rows, "problems": problems}), sys.stdout, indent=1)
        print()
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
