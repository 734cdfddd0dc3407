#!/usr/bin/env python
"""Mixed-load benchmark: do streaming users stall while long prompts arrive?

8 users stream continuously (closed loop: short prompt, --stream-gen tokens,
ignore_eos, next request at once) while long prompts (--long-sizes tokens,
alternating) arrive every --interval seconds. Reported per server: the
streamers' inter-token latency (ITL p50/p99/max, all gaps pooled) and the
long prompts' time to first token; ringserve side by side with llama-server
(the same llama.cpp build, started by scripts/bench_servers.py with the same
-np, -c, -t, -fa and --swa-full), in one run, alternating rounds (A B A B),
ratios as the median of per-round pairs. ringserve's engine phase table
(/metrics t_*_s) and its longest step (step histogram) come with it.

Why token-id prompts with cache_prompt off: both servers evaluate exactly
the same tokens, none of them reused from an earlier request.

  python scripts/bench_mixed.py --plot mixed.png      # full run (~5 min)
  python scripts/bench_mixed.py --quick --json        # the test suite's
"""
from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import threading
import time

import numpy as np

import loadgen
from bench_report import phases
from bench_servers import Running, Settings, add_server_args
from bench_serving import MODES, _clean, pair_setup, save_fig, warm_up


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("-m", "--model", default="", help="GGUF (default: ringserve's default model)")
    a("--servers", default="ringserve,llama-server", help="ringserve and/or llama-server")
    a("--streamers", type=int, default=8, help="users streaming continuously")
    a("--stream-gen", type=int, default=64, help="tokens per streamer request")
    a("--long-sizes", default="1000,4000", help="long prompt sizes in tokens, taken in turn")
    a("--long-count", type=int, default=6, help="long prompts per round")
    a("--interval", type=float, default=8.0, help="seconds between long prompt arrivals")
    a("--lead", type=float, default=3.0, help="seconds of streaming before the first long prompt")
    a("-np", "--slots", type=int, default=10, help="slots (streamers + room for two long prompts)")
    a("-c", "--ctx-size", type=int, default=0, help="total context (default: 4096 per slot)")
    a("-t", "--threads", type=int, default=2)
    a("-fa", "--flash-attn", default="auto", choices=("on", "off", "auto"))
    a("--rounds", type=int, default=2, help="A B A B rounds")
    a("--seed", type=int, default=1234)
    add_server_args(a, timeout=300.0)  # --ringserve-args "--step-tokens -1": no budget
    a("--plot", default="", help="PNG: each server's streamer gaps over time, long prompt arrivals marked")
    a("--json", action="store_true", help="JSON on stdout (the tables go to stderr)")
    a("--quick", action="store_true", help="one short round (2 streamers, 300/600-token prompts): completeness only")
    args = p.parse_args(argv)
    if args.quick:
        args.streamers, args.stream_gen, args.long_sizes, args.long_count = 2, 16, "300,600", 2
        args.interval, args.lead, args.slots, args.rounds = 0.75, 0.5, 4, 1
    args.sizes = [int(x) for x in args.long_sizes.split(",") if x.strip()]
    args.ctx_size = args.ctx_size or args.slots * 4096
    args.cache_prompt = False
    return args


def long_prompts(model: str, sizes: list[int], count: int) -> list[list[int]]:
    """count token-id prompts, sizes in turn, no two sharing a prefix past BOS."""
    import logging

    from engine.vocab import Vocab, init_backend

    init_backend(forward=logging.ERROR)
    text = ("The keeper of the northern lighthouse kept a log of every ship, storm and star he saw; "
            "in winter the ice closed the harbour, and in spring the fishermen came back. ") * 400
    with Vocab.load(model) as v:
        base = v.tokenize(text, True, False)
        bos = base[0] if v.add_bos else None
    body = base[1:] if bos is not None else base
    out = []
    for j in range(count):
        n = sizes[j % len(sizes)]
        k = (j * 37) % (len(body) - n)
        ids = ([bos] if bos is not None else []) + body[k:k + n - (bos is not None)]
        ids[1 if bos is not None else 0] = 1000 + j  # distinct from the first token on
        out.append([int(t) for t in ids])
    return out


def one_run(srv, st: Settings, args, longs: list[list[int]], rnd: int, bar, problems: list[str],
            commands: dict) -> dict:
    """Start one server, stream with --streamers users, send the long prompts
    on schedule, stop the streamers once every long prompt answered."""
    samp = MODES["greedy"]
    stream_api = loadgen.native_api(args.stream_gen, samp, args.seed, False)
    long_api = loadgen.native_api(8, samp, args.seed, False)
    shorts = loadgen.make_prompts(64)
    with Running(srv, st) as run:
        try:
            if srv.name not in commands:
                commands[srv.name] = run.cmd
                bar.write(f"{srv.name}: {shlex.join(run.cmd)}", file=sys.stderr)
            warm_up(run, loadgen.native_api(4, samp, args.seed, False))
            m0 = run.metrics()
            halt = threading.Event()
            streams: list[loadgen.Result] = []
            longs_out: list[loadgen.Result | None] = [None] * len(longs)

            def streamer(k: int) -> None:
                i = k
                while not halt.is_set():
                    streams.append(loadgen.stream_one(run.port, stream_api, shorts[i % len(shorts)], i, args.timeout))
                    i += args.streamers

            def long_one(j: int) -> None:
                longs_out[j] = loadgen.stream_one(run.port, long_api, longs[j], 1000 + j, args.timeout)
                bar.update(1)

            t0 = time.perf_counter()
            ths = [threading.Thread(target=streamer, args=(k,), daemon=True) for k in range(args.streamers)]
            for th in ths:
                th.start()
            lts = []
            for j in range(len(longs)):
                time.sleep(max(t0 + args.lead + j * args.interval - time.perf_counter(), 0.0))
                bar.set_description(f"r{rnd + 1} {srv.name}: long prompt {j + 1}/{len(longs)}")
                th = threading.Thread(target=long_one, args=(j,), daemon=True)
                th.start()
                lts.append(th)
            for th in lts:
                th.join(args.timeout)
            t_end = time.perf_counter()
            halt.set()
            for th in ths:
                th.join(args.timeout)
            m1 = run.metrics()
        finally:
            problems += run.stop()
    errs = [f"{srv.name} r{rnd + 1} stream #{r.index}: {r.error}" for r in streams if not r.ok]
    errs += [f"{srv.name} r{rnd + 1} long #{j}: {r.error if r else 'no answer'}"
             for j, r in enumerate(longs_out) if r is None or not r.ok]
    problems += errs[:5]
    # streamer gaps up to the last long prompt's answer (after it, nothing competes)
    gaps, marks = [], []
    for r in streams:
        if not r.ok or not r.itl:
            continue
        t = r.t_send + r.ttft
        for g in r.itl:
            t += g
            if t <= t_end:
                gaps.append(g)
                marks.append((t - t0, g))
    ok = [r for r in longs_out if r is not None and r.ok]
    ttft = {n: [r.ttft for r in ok if len(longs[r.index - 1000]) == n] for n in args.sizes}
    return {
        "server": srv.name, "round": rnd, "window_s": t_end - t0,
        "itl_ms": itl_stats(gaps), "n_gaps": len(gaps),
        "stream_ttft_ms": loadgen.pct([r.ttft for r in streams if r.ok], (50, 99)),
        "long_ttft_ms": {str(n): [1e3 * x for x in v] for n, v in ttft.items()},
        "long_ttft_p50_ms": loadgen.pct([r.ttft for r in ok], (50,))[0],
        "long_done": len(ok), "long_sent": len(longs),
        "phases": phases(m0, m1) if srv.name == "ringserve" and m0 else None,
        "longest_step_ms": longest_step(m0, m1) if srv.name == "ringserve" and m0 else None,
        "_marks": marks, "_arrivals": [args.lead + j * args.interval for j in range(len(longs))],
    }


def itl_stats(gaps: list[float]) -> dict:
    if not gaps:
        return {"p50": math.nan, "p99": math.nan, "max": math.nan}
    p50, p99 = loadgen.pct(gaps, (50, 99))
    return {"p50": p50, "p99": p99, "max": 1e3 * max(gaps)}


def longest_step(m0: dict, m1: dict) -> float | None:
    """ringserve's longest step in the run (ms), as the upper bound of the
    first cumulative step-histogram bucket that holds every new step."""
    key = "ringserve:step_seconds_bucket"
    tops = sorted((float(k.split('le="')[1].split('"')[0]), m1[k] - m0.get(k, 0.0))
                  for k in m1 if k.startswith(key) and 'le="+Inf"' not in k)
    if not tops:
        return None
    total = tops[-1][1]
    return next((1e3 * le for le, n in tops if n >= total), None)


def med(xs: list[float]) -> float:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return float(np.median(xs)) if xs else math.nan


def summarize(runs: list[dict], names: list[str], sizes: list[int]) -> list[dict]:
    """One row per server: pooled percentiles, medians over rounds, and
    ringserve's ratios against the other server (median of round pairs)."""
    rows = []
    by = {n: [r for r in runs if r["server"] == n] for n in names}
    base = {r["round"]: r for r in by.get("ringserve", [])}
    for n in names:
        rs = by[n]
        if not rs:
            continue
        row = {"server": n, "rounds": len(rs),
               "itl_p50": med([r["itl_ms"]["p50"] for r in rs]), "itl_p99": med([r["itl_ms"]["p99"] for r in rs]),
               "itl_max": max(r["itl_ms"]["max"] for r in rs),
               "long_ttft_p50": med([r["long_ttft_p50_ms"] for r in rs]),
               "long_ttft_by_size": {str(s): med([x for r in rs for x in r["long_ttft_ms"][str(s)]]) for s in sizes},
               "stream_ttft_p50": med([r["stream_ttft_ms"][0] for r in rs]),
               "long_done": sum(r["long_done"] for r in rs), "long_sent": sum(r["long_sent"] for r in rs)}
        row["itl_max_over_p50"] = row["itl_max"] / row["itl_p50"] if row["itl_p50"] else math.nan
        if n != "ringserve" and base:
            pairs = [(base[r["round"]], r) for r in rs if r["round"] in base]
            row["rs_itl_p99"] = med([b["itl_ms"]["p99"] / r["itl_ms"]["p99"] for b, r in pairs])
            row["rs_itl_max"] = med([b["itl_ms"]["max"] / r["itl_ms"]["max"] for b, r in pairs])
            row["rs_long_ttft"] = med([b["long_ttft_p50_ms"] / r["long_ttft_p50_ms"] for b, r in pairs])
        rows.append(row)
    return rows


def f(x, fmt: str = ".0f") -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)


def print_tables(rows: list[dict], runs: list[dict], args, out) -> None:
    print(f"\n{args.streamers} streamers (~12-token prompts, {args.stream_gen} tokens each, greedy, closed loop) "
          f"while {args.long_count} long prompts of {args.long_sizes} tokens arrive every {args.interval:g} s; "
          f"-np {args.slots} -c {args.ctx_size} -t {args.threads} -fa {args.flash_attn} --swa-full; "
          f"{args.rounds} round(s) A B A B; ms; rs÷ = ringserve over llama-server, median of round pairs\n", file=out)
    sz = " | ".join(f"TTFT {s}" for s in args.sizes)
    hdr = f"| server | ITL p50 | ITL p99 | ITL max | max/p50 | long TTFT p50 | {sz} | stream TTFT p50 | long done |"
    print(hdr, file=out)
    print("|" + "---|" * (hdr.count("|") - 1), file=out)
    for r in rows:
        szs = " | ".join(f(r["long_ttft_by_size"][str(s)]) for s in args.sizes)
        print(f"| {r['server']} | {f(r['itl_p50'])} | {f(r['itl_p99'])} | {f(r['itl_max'])} "
              f"| {f(r['itl_max_over_p50'], '.1f')} | {f(r['long_ttft_p50'])} | {szs} | {f(r['stream_ttft_p50'])} "
              f"| {r['long_done']}/{r['long_sent']} |", file=out)
    other = [r for r in rows if "rs_itl_p99" in r]
    rs = next((r for r in rows if r["server"] == "ringserve"), None)
    if other and rs:
        o = other[0]
        print(f"\nrs÷ {o['server']}: ITL p99 {f(o['rs_itl_p99'], '.2f')} (goal <= 0.5), ITL max "
              f"{f(o['rs_itl_max'], '.2f')}, long TTFT p50 {f(o['rs_long_ttft'], '.2f')} (goal <= 1.2); ringserve "
              f"ITL max / own p50 {f(rs['itl_max_over_p50'], '.1f')} (goal <= 3)", file=out)
    ph = [r for r in runs if r["phases"]]
    if ph:
        names = list(ph[0]["phases"]["ms_per_step"])
        print("\nringserve engine phases per round (/metrics t_*_s): ms per step; longest step = step-histogram "
              "bucket bound\n", file=out)
        hdr = "| round | steps | tokens/step | " + " | ".join(names) + " | longest step ms |"
        print(hdr, file=out)
        print("|" + "---|" * (hdr.count("|") - 1), file=out)
        for r in ph:
            p = r["phases"]
            print(f"| {r['round'] + 1} | {p['steps']:.0f} | {f(p['tokens_per_step'], '.1f')} | "
                  + " | ".join(f(p["ms_per_step"][k], ".2f") for k in names)
                  + f" | {f(r['longest_step_ms'])} |", file=out)


def plot(runs: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["server"] for r in runs))
    fig, axes = plt.subplots(len(names), 1, figsize=(11, 3.2 * len(names)), sharex=True, squeeze=False)
    for ax, n in zip(axes[:, 0], names):
        r = next(r for r in runs if r["server"] == n)  # round 1
        xs = [t for t, _ in r["_marks"]]
        ys = [1e3 * g for _, g in r["_marks"]]
        ax.scatter(xs, ys, s=3, color="C0" if n == "ringserve" else "C1")
        for t in r["_arrivals"]:
            ax.axvline(t, color="grey", linestyle=":", linewidth=1)
        ax.set_yscale("log")
        ax.set_ylabel("gap between tokens, ms")
        ax.set_title(f"{n}: streamers' inter-token gaps (round 1); dotted: a long prompt arrives")
        ax.grid(True, alpha=0.3)
    axes[-1, 0].set_xlabel("seconds since the streamers started")
    save_fig(fig, path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tqdm, model, servers = pair_setup(args)
    longs = long_prompts(model, args.sizes, args.long_count)
    st = Settings(model=model, slots=args.slots, ctx=args.ctx_size, threads=args.threads, flash_attn=args.flash_attn)
    runs: list[dict] = []
    problems: list[str] = []
    commands: dict[str, list[str]] = {}
    bar = tqdm(total=args.rounds * len(servers) * len(longs), unit="long", file=sys.stderr, mininterval=0.5,
               dynamic_ncols=True)
    try:
        for rnd in range(args.rounds):
            for srv in servers:
                bar.set_description(f"r{rnd + 1} {srv.name}: starting")
                try:
                    runs.append(one_run(srv, st, args, longs, rnd, bar, problems, commands))
                except RuntimeError as e:
                    problems.append(f"{srv.name} r{rnd + 1}: {e}")
                    bar.write(problems[-1], file=sys.stderr)
    except KeyboardInterrupt as e:
        problems.append(f"interrupted by {e or 'SIGINT'}")
    finally:
        bar.close()
    names = [s.name for s in servers]
    rows = summarize(runs, names, args.sizes)
    out = sys.stderr if args.json else sys.stdout
    print_tables(rows, runs, args, out)
    for pr in problems:
        print(f"problem: {pr}", file=out)
    if args.plot and runs:
        plot(runs, args.plot)
        print(f"plot: {args.plot}", file=out)
    ok = not problems and len(runs) == args.rounds * len(servers)
    if args.json:
        for r in runs:
            r.pop("_marks", None)
        doc = {"ok": ok, "model": model, "servers": names, "commands": commands,
               "settings": {k: v for k, v in vars(args).items() if k not in ("json", "plot")},
               "summary": rows, "runs": runs, "problems": problems}
        json.dump(_clean(doc), sys.stdout, indent=1, allow_nan=False)
        print()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
