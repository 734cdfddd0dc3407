#!/usr/bin/env python
"""Prefix-cache benchmark: what each server evaluates when prompts come back.

Workloads (scripts/_cache_workloads.py): multi-turn chat with more
conversations than slots (16 x 4 and 64 x 6), shared documents (8 groups x
16 questions over /completion; 6 x 8 over /v1/chat/completions, "docs"), two agents alternating on one slot (llama.cpp 27148, with a
cross-talk check) and unique prompts (the cache's overhead). Each workload
runs on a fresh ringserve and a fresh llama-server (--share-server, as
--quick: the workloads of one slot count on one start; the floor then counts
everything that start was sent) (the same llama.cpp
build, its default host prompt cache, --swa-full; scripts/bench_servers.py
starts both with the same -np, -c, -t, -fa), alternating A B per round, in
one run; every request streams from /completion with cache_prompt true,
greedy, ignore_eos.

Reported per workload and server: prompt tokens evaluated (timings.prompt_n
summed) against the floor (tokens new in each prompt, counted with the
model's tokenizer), tokens reused (cache_n), TTFT p50/p90 by turn index,
wall time, output tokens/s and the peak memory of the server's process
tree, sampled every second (--mem-every: a sample reads
/proc/PID/smaps_rollup of every process, ~21 ms of CPU for ringserve's five
and ~9 for llama-server's one on the AVX2 VM; at 0.25 s that took ~8% of a
core from servers whose llama.cpp threads hold both, and both servers' chat
later turns read 10-15% slower, docs/PERFORMANCE.md). "mem MiB (PSS sum)",
the peak of the PSS summed over its processes, is the figure compared (the
ratio table's "mem"), and "RSS sum MiB", the peak of their summed RSS, is
printed beside it. Why PSS
(scripts/_treemem.py): ringserve's processes map the same pages (the arena,
shared libraries, the vocabulary the gunicorn master's workers share
copy-on-write), and a sum of RSS counts each such page once per process;
PSS divides a shared page among the processes mapping it, so the tree's sum
is what it takes from the machine. llama-server is one process: its PSS is
its RSS less the share of its libraries that other processes on the host map.

  python scripts/bench_cache.py --plot cache.png                  # all (~30 min)
  python scripts/bench_cache.py --workloads chat,agents           # a subset
  python scripts/bench_cache.py --quick --json                    # the test suite's
"""
from __future__ import annotations

import argparse
import json
import math
import shlex
import sys

import numpy as np

import _cache_workloads as W
from frontends.testing.http import metrics
import loadgen
from _treemem import MemPeak
from bench_mixed import f, med
from bench_servers import Running, Settings, add_server_args, run_rounds
from bench_serving import MODES, _clean, pair_setup, save_fig

ALL = ("chat", "chat64", "prefix", "docs", "agents", "unique")
MEM_EVERY = 1.0  # seconds between PSS samples (the module doc says why not 0.25; bench_admit's runs use it too)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("-m", "--model", default="", help="GGUF (default: ringserve's default model)")
    a("--servers", default="ringserve,llama-server", help="ringserve and/or llama-server")
    a("--workloads", default=",".join(ALL), help=f"comma list of {', '.join(ALL)}")
    a("--chat-convs", type=int, default=16, help="conversations of the chat workload")
    a("--chat-turns", type=int, default=4, help="turns per conversation of the chat workload")
    a("-c", "--ctx-per-slot", type=int, default=4096, help="context per slot")
    a("-t", "--threads", type=int, default=2)
    a("-fa", "--flash-attn", default="auto", choices=("on", "off", "auto"))
    a("--rounds", type=int, default=1, help="A B rounds per workload")
    a("--seed", type=int, default=1234, help="the workloads' text")
    add_server_args(a, timeout=600.0)
    a("--mem-every", type=float, default=MEM_EVERY, help="seconds between samples of the tree's PSS (each costs CPU)")
    a("--plot", default="", help="PNG: evaluated / floor per workload, TTFT p50 by turn")
    a("--json", action="store_true", help="JSON on stdout (the tables go to stderr)")
    a("--share-server", action="store_true",
      help="one server start per slot count, its workloads one after another (floor over all of them)")
    a("--quick", action="store_true", help="tiny versions of every workload, one round, --share-server: "
      "completeness only")
    args = p.parse_args(argv)
    args.names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    bad = [w for w in args.names if w not in ALL]
    if bad:
        p.error(f"unknown workload(s) {bad}; choose from {ALL}")
    if args.quick:  # chat64's quick form would be chat's: left out unless named
        args.rounds, args.ctx_per_slot, args.share_server = 1, 1024, True
        if args.workloads == ",".join(ALL):
            args.names = [n for n in ALL if n != "chat64"]
    return args


def one_run(srv, model: str, args, name: str, rnd: int, tok: W.Tokens, bar, problems: list[str],
            commands: dict) -> dict:
    """A fresh server for one workload; returns its records and figures."""
    return one_start(srv, model, args, [name], rnd, tok, bar, problems, commands)[0]


def share_groups(names: list[str], quick: bool, seed: int, sizes: dict) -> list[list[str]]:
    """--share-server: the workloads that run on one server start, those of
    the same slot count together, in the order given."""
    groups: dict[int, list[str]] = {}
    for n in names:
        groups.setdefault(W.build(n, quick, seed, sizes).slots, []).append(n)
    return list(groups.values())


def one_start(srv, model: str, args, names: list[str], rnd: int, tok: W.Tokens, bar, problems: list[str],
              commands: dict) -> list[dict]:
    """A fresh server for the workloads ``names`` (of one slot count), one
    after another; one record per workload. Invariant: the floor and the
    cross-talk bound are over everything this server was sent (one ``seen``
    for the whole start), so a later workload's reuse of an earlier one's
    tokens is not reported below the floor; the cache counters are each
    workload's own (the first's as the server reports them, a later one's
    the difference since the one before; gauges as they stand)."""
    sizes = W.sizes(args)
    ws = [W.build(n, args.quick, args.seed, sizes) for n in names]
    assert len({w.slots for w in ws}) == 1, [(w.name, w.slots) for w in ws]
    st = Settings(model=model, slots=ws[0].slots, ctx=ws[0].slots * args.ctx_per_slot, threads=args.threads,
                  flash_attn=args.flash_attn)
    bar.set_description(f"{'+'.join(names)} r{rnd + 1} {srv.name}: starting")
    seen: list = []
    out: list[dict] = []
    with Running(srv, st) as run:
        try:
            key = f"{srv.name} -np {st.slots}"
            if key not in commands:
                commands[key] = run.cmd
                bar.write(f"{srv.name}: {shlex.join(run.cmd)}", file=sys.stderr)
            before: dict[str, float] = {}  # the first workload's figures: the server's whole
            for name, w in zip(names, ws):
                mem = MemPeak(run.proc.pid, args.mem_every)
                bar.set_description(f"{name} r{rnd + 1} {srv.name}")
                wire = None
                if name == "docs":  # the chat API (timings in the usage chunk, as from /completion)
                    import _fleet as F

                    wire = F.chat_wire("model", w.n_predict, F.chat_template(tok), "")
                recs, wall = W.run(run.port, w, tok, args.timeout, MODES["greedy"],
                                   on_done=lambda _r: bar.update(1), wire=wire, seen=seen)
                pss, rss = mem.stop()
                cache = {}
                if srv.name == "ringserve":
                    after = _cache_metrics(run.port)
                    cache = {k: v - before.get(k, 0.0) if "_total" in k else v for k, v in after.items()}
                    before = after
                errs = [f"{name} {srv.name} r{rnd + 1} conv {r['conv']} turn {r['turn']}: {r['error']}"
                        for r in recs if not r["ok"]]
                problems += errs[:5]
                out.append({"workload": name, "title": w.title, "server": srv.name, "round": rnd, "slots": w.slots,
                            "clients": w.clients, "n_predict": w.n_predict, "wall_s": wall,
                            "pss_peak_mib": pss, "rss_peak_mib": rss, "cache_metrics": cache,
                            "records": recs, **figures(recs, wall)})
        finally:
            problems += run.stop()
    return out


def _cache_metrics(port: int) -> dict[str, float]:
    return {k: v for k, v in metrics(f"http://127.0.0.1:{port}").items()
            if k.startswith(("ringserve:cache_", "ringserve:steps", "ringserve:engine_phase", "ringserve:express"))}


def figures(recs: list[dict], wall: float) -> dict:
    ok = [r for r in recs if r["ok"]]
    turns = sorted({r["turn"] for r in ok})
    by_turn = {t: loadgen.pct([r["ttft"] for r in ok if r["turn"] == t], (50, 90)) for t in turns}
    later = [r["ttft"] for r in ok if r["turn"] > 0]
    n_out = sum(r["n_out"] for r in ok)
    return {
        "requests": len(recs), "ok": len(ok),
        "evaluated": sum(r["prompt_n"] for r in ok), "floor": sum(r["floor"] for r in ok),
        "reused": sum(r["cache_n"] for r in ok), "prompt_tokens": sum(r["n_tokens"] for r in ok),
        # token accounting: prompt_n + cache_n must be the prompt's length, request by request
        "accounting_errors": sum(r["prompt_n"] + r["cache_n"] != r["n_tokens"] for r in ok),
        "crosstalk": sum(bool(r["foreign"]) for r in ok), "overclaimed": sum(r["cache_n"] > r.get("shared_end", r["shared"]) for r in ok),
        "ttft_first_p50": loadgen.pct([r["ttft"] for r in ok if r["turn"] == 0], (50,))[0],
        "ttft_later": loadgen.pct(later, (50, 90)),
        "ttft_by_turn": {str(t): v for t, v in by_turn.items()},
        "out_tok_s": n_out / wall if wall and math.isfinite(wall) else math.nan,
        # the streams' gaps, pooled: what a question decoded alone before a step costs the others (issue 24)
        "itl_ms": loadgen.pct([x for r in ok for x in r.get("itl", ())], (50, 99)),
    }


def print_tables(runs: list[dict], args, out) -> None:
    print(f"\nprefix-cache workloads, /completion cache_prompt true, greedy, ignore_eos; -t {args.threads} "
          f"-fa {args.flash_attn} --swa-full, {args.ctx_per_slot} context per slot; {args.rounds} round(s) A B; "
          "TTFT ms; floor = prompt tokens no earlier prompt (or prompt + answer) starts with; mem = peak of the "
          "PSS summed over the server's processes (shared pages counted once), RSS sum = peak of their summed RSS "
          "(shared pages counted once per process)\n", file=out)
    hdr = ("| workload | server | -np/clients | requests | prompt evaluated | floor | eval÷floor | reused "
           "| TTFT p50 turn 0 | later-turn TTFT p50 | p90 | ITL p50 / p99 | wall s | out tok/s | mem MiB (PSS sum) | RSS sum MiB "
           "| cross-talk |")
    print(hdr, file=out)
    print("|" + "---|" * (hdr.count("|") - 1), file=out)
    for r in runs:
        ev, fl = r["evaluated"], r["floor"]
        print(f"| {r['workload']} | {r['server']}{'' if args.rounds == 1 else ' r' + str(r['round'] + 1)} "
              f"| {r['slots']}/{r['clients']} | {r['ok']}/{r['requests']} | {ev:,} | {fl:,} | {f(ev / fl if fl else math.nan, '.2f')} "
              f"| {r['reused']:,} | {f(r['ttft_first_p50'])} | {f(r['ttft_later'][0])} | {f(r['ttft_later'][1])} "
              f"| {f(r.get('itl_ms', (math.nan,) * 2)[0])} / {f(r.get('itl_ms', (math.nan,) * 2)[1])} "
              f"| {f(r['wall_s'], '.1f')} | {f(r['out_tok_s'], '.1f')} | {f(r.get('pss_peak_mib', math.nan))} "
              f"| {f(r['rss_peak_mib'])} "
              f"| {r['crosstalk'] + r['overclaimed']} |", file=out)
    multi = [r for r in runs if len(r["ttft_by_turn"]) > 1]
    if multi:
        print("\nTTFT p50 / p90 ms by turn index (prefix: the k-th question of its group to arrive)\n", file=out)
        n = max(len(r["ttft_by_turn"]) for r in multi)
        hdr = "| workload | server | " + " | ".join(f"turn {t}" for t in range(n)) + " |"
        print(hdr, file=out)
        print("|" + "---|" * (hdr.count("|") - 1), file=out)
        for r in multi:
            cells = [f"{f(v[0])} / {f(v[1])}" for _, v in sorted(r["ttft_by_turn"].items(), key=lambda kv: int(kv[0]))]
            cells += ["-"] * (n - len(cells))
            print(f"| {r['workload']} | {r['server']} | " + " | ".join(cells) + " |", file=out)
    pairs = ratios(runs)
    if pairs:
        print("\nringserve ÷ llama-server (median of round pairs)\n", file=out)
        print("| workload | evaluated | TTFT p50 turn 0 | later-turn TTFT p50 | ITL p99 | wall | mem (PSS sum) "
              "| RSS sum |", file=out)
        print("|---|---|---|---|---|---|---|---|", file=out)
        for name, v in pairs.items():
            print(f"| {name} | {f(v['evaluated'], '.2f')} | {f(v['first'], '.2f')} | {f(v['ttft_later'], '.2f')} "
                  f"| {f(v['itl_p99'], '.2f')} | {f(v['wall'], '.2f')} "
                  f"| {f(v['mem'], '.2f')} | {f(v['rss'], '.2f')} |", file=out)
    rs = [r for r in runs if r.get("cache_metrics")]
    if rs:
        print("\nringserve's cache at the end of each run (/metrics): copies from another slot, contents parked "
              "whole (--cache-streams), saves to and loads from host RAM, what RAM holds, the longest any request's "
              "copies held the engine loop, against the mean llama_decode time of a step\n", file=out)
        print("| workload | copies | parked | RAM saves | RAM loads | RAM entries | RAM MiB | longest copy hold ms "
              "| mean decode step ms |", file=out)
        print("|---|---|---|---|---|---|---|---|---|", file=out)
        for r in rs:
            m = r["cache_metrics"]
            g = (lambda k: m.get(f"ringserve:{k}", math.nan))  # noqa: E731
            step = 1e3 * m.get('ringserve:engine_phase_seconds_total{phase="decode"}', math.nan) / max(
                g("steps_total"), 1)
            print(f"| {r['workload']} | {f(g('cache_copies_total'))} | {f(g('cache_parks_total'))} "
                  f"| {f(g('cache_ram_saves_total'))} | {f(g('cache_ram_loads_total'))} | {f(g('cache_ram_entries'))} "
                  f"| {f(g('cache_ram_bytes') / 2**20, '.1f')} | {f(g('cache_copy_ms_max'), '.1f')} "
                  f"| {f(step, '.1f')} |", file=out)
    for r in runs:
        if r["accounting_errors"]:
            print(f"accounting: {r['workload']} {r['server']}: {r['accounting_errors']} request(s) with "
                  "prompt_n + cache_n != prompt tokens", file=out)
        if r["crosstalk"] or r["overclaimed"]:
            print(f"cross-talk: {r['workload']} {r['server']}: {r['crosstalk']} answer(s) naming another "
                  f"conversation's marker, {r['overclaimed']} request(s) reusing more than they share", file=out)


def ratios(runs: list[dict]) -> dict:
    out = {}
    for name in dict.fromkeys(r["workload"] for r in runs):
        base = {r["round"]: r for r in runs if r["workload"] == name and r["server"] == "ringserve"}
        other = [r for r in runs if r["workload"] == name and r["server"] == "llama-server" and r["round"] in base]
        if not other:
            continue
        pr = [(base[o["round"]], o) for o in other]
        div = lambda a, b: a / b if b else math.nan  # noqa: E731
        out[name] = {"evaluated": med([div(b["evaluated"], o["evaluated"]) for b, o in pr]),
                     "ttft_later": med([div(b["ttft_later"][0], o["ttft_later"][0]) for b, o in pr]),
                     "wall": med([div(b["wall_s"], o["wall_s"]) for b, o in pr]),
                     "first": med([div(b["ttft_first_p50"], o["ttft_first_p50"]) for b, o in pr]),
                     "itl_p99": med([div(b.get("itl_ms", [math.nan] * 2)[1], o.get("itl_ms", [math.nan] * 2)[1])
                                     for b, o in pr]),
                     "mem": med([div(b.get("pss_peak_mib", math.nan), o.get("pss_peak_mib", math.nan)) for b, o in pr]),
                     "rss": med([div(b["rss_peak_mib"], o["rss_peak_mib"]) for b, o in pr])}
    return out


def plot(runs: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["workload"] for r in runs))
    servers = list(dict.fromkeys(r["server"] for r in runs))
    first = {(r["workload"], r["server"]): r for r in runs if r["round"] == 0}
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.5))
    x = np.arange(len(names))
    wd = 0.8 / max(len(servers), 1)
    for k, s in enumerate(servers):
        ys = [first[(n, s)]["evaluated"] / max(first[(n, s)]["floor"], 1) if (n, s) in first else 0 for n in names]
        a1.bar(x + k * wd, ys, wd, label=s, color=f"C{k}")
    a1.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    a1.set_xticks(x + wd * (len(servers) - 1) / 2, names)
    a1.set_ylabel("prompt tokens evaluated ÷ floor")
    a1.set_title("work done per workload (1 = a perfect cache)")
    a1.legend()
    for k, s in enumerate(servers):
        for j, n in enumerate(names):
            r = first.get((n, s))
            if r is None or len(r["ttft_by_turn"]) < 2 or n == "prefix":
                continue
            ts = sorted(r["ttft_by_turn"], key=int)
            a2.plot([int(t) for t in ts], [r["ttft_by_turn"][t][0] for t in ts], marker="o", color=f"C{k}",
                    linestyle=("-", "--", ":", "-.")[j % 4], label=f"{s} {n}")
    a2.set_xlabel("turn index")
    a2.set_ylabel("TTFT p50, ms")
    a2.set_yscale("log")
    a2.set_title("time to first token by turn")
    a2.legend(fontsize=8)
    for ax in (a1, a2):
        ax.grid(True, alpha=0.3)
    save_fig(fig, path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tqdm, model, servers = pair_setup(args)
    tok = W.Tokens(model)
    sizes = W.sizes(args)
    total = sum(len(W.build(n, args.quick, args.seed, sizes).order) for n in args.names) * len(servers) * args.rounds
    runs: list[dict] = []
    problems: list[str] = []
    commands: dict[str, list[str]] = {}
    bar = tqdm(total=total, unit="req", file=sys.stderr, mininterval=0.5, dynamic_ncols=True)
    units = share_groups(args.names, args.quick, args.seed, sizes) if args.share_server else [[n] for n in args.names]
    batches: list[list[dict]] = []
    try:
        run_rounds(batches, ["+".join(u) for u in units], args.rounds, servers, lambda srv: srv.name,
                   lambda srv, names, rnd: one_start(srv, model, args, names.split("+"), rnd, tok, bar, problems,
                                                     commands), problems, bar)
    except KeyboardInterrupt as e:
        problems.append(f"interrupted by {e or 'SIGINT'}")
    finally:
        bar.close()
        tok.close()
        order = [s.name for s in servers]  # the tables' order, as without --share-server
        runs += sorted((r for b in batches for r in b),
                       key=lambda r: (args.names.index(r["workload"]), r["round"], order.index(r["server"])))
    out = sys.stderr if args.json else sys.stdout
    print_tables(runs, args, out)
    for pr in problems:
        print(f"problem: {pr}", file=out)
    if args.plot and runs:
        plot(runs, args.plot)
        print(f"plot: {args.plot}", file=out)
    ok = not problems and len(runs) == len(args.names) * len(servers) * args.rounds
    if args.json:
        doc = {"ok": ok, "model": model, "servers": [s.name for s in servers], "commands": commands,
               "settings": {k: v for k, v in vars(args).items() if k not in ("json", "plot")},
               "runs": runs, "ratios": ratios(runs), "problems": problems}
        json.dump(_clean(doc), sys.stdout, indent=1, allow_nan=False)
        print()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
