#!/usr/bin/env python
"""Speculative decoding benchmark: ringserve against llama-server, speculation off and on.

Two workloads over /completion (greedy, ignore_eos, cache_prompt off, every
prompt distinct): (a) ``copy``, input copying: a passage of this repository's
source followed by its first lines again, which a base model continues by
copying it (an agent rewriting a file with few changes); (b) ``plain``,
ordinary short prompts. Each at 1, 4 and 32 concurrent streams. Per server,
speculation off and each of ``--types`` (n-gram lookup: no draft model
needed); a server's best type is the one with the highest copy tok/s at one
stream, and the ratios compare it with the same server without speculation
and with llama-server's best. One run, rounds A B A B (server order
alternates), figures the median over rounds. tok/s = output tokens / wall
time of the cell; TTFT and ITL p50/p99 from the SSE events; acceptance =
draft_n_accepted / draft_n from the final events' timings.

  python scripts/bench_spec.py --plot docs/img/bench_spec.png   # full run (~10 min)
  python scripts/bench_spec.py --quick --json                   # the test suite's
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys

import numpy as np

import loadgen
from bench_servers import Running, Settings, add_server_args
from bench_serving import _clean, pair_setup, save_fig, warm_up

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOALS = (("copy", 1, "off", 1.8), ("copy", 1, "llama", 1.1), ("copy", 4, "off", 1.3),
         ("plain", 1, "off", 0.97), ("plain", 4, "off", 0.97), ("plain", 32, "off", 0.97),
         ("copy", 32, "off", 0.97))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("-m", "--model", default="", help="GGUF (default: ringserve's default model)")
    a("--servers", default="ringserve,llama-server", help="ringserve and/or llama-server")
    a("--types", default="ngram-simple,ngram-map-k", help="--spec-type values tried per server")
    a("--streams", default="1,4,32", help="concurrent streams per cell")
    a("--gen", type=int, default=96, help="tokens per request")
    a("--gen-wide", type=int, default=48, help="tokens per request at 32 streams")
    a("-t", "--threads", type=int, default=2)
    a("-fa", "--flash-attn", default="auto", choices=("on", "off", "auto"))
    a("--rounds", type=int, default=2, help="A B A B rounds (the types are probed in round 1)")
    a("--seed", type=int, default=1234)
    add_server_args(a, timeout=300.0)
    a("--plot", default="", help="PNG: tok/s per cell, each server off and with its best type")
    a("--json", action="store_true", help="JSON on stdout (the tables go to stderr)")
    a("--quick", action="store_true", help="one round, one stream, short outputs: completeness only")
    args = p.parse_args(argv)
    if args.quick:
        args.streams, args.gen, args.gen_wide, args.rounds, args.types = "1", 24, 16, 1, "ngram-simple"
    return args


def copy_prompts(n: int) -> list[str]:
    """n distinct copy prompts: passages of this repository's Python sources, then their first 3 lines again."""
    files = sorted(glob.glob(os.path.join(ROOT, "engine", "*.py")) + glob.glob(os.path.join(ROOT, "ipc", "*.py")))
    out, i = [], 0
    while len(out) < n:
        with open(files[i % len(files)]) as f:
            text = f.read()
        start = 1200 * (i // len(files)) % max(len(text) - 1400, 1)
        chunk = text[start:start + 1200]
        lines = chunk.split("\n")[1:]  # from a line start
        chunk = "\n".join(lines)
        out.append(chunk + "\n\n# ---- a copy of the code above ----\n" + "\n".join(lines[:3]) + "\n")
        i += 1
    return out


def api(gen: int, seed: int) -> loadgen.Api:
    """/completion, greedy; the final event's timings carry draft_n / draft_n_accepted."""
    def body(prompt: str, i: int) -> dict:
        return {"prompt": prompt, "n_predict": gen, "stream": True, "ignore_eos": True, "cache_prompt": False,
                "seed": seed + i, "temperature": 0.0}

    def parse(obj: dict):
        if obj.get("stop"):
            t = obj.get("timings") or {}
            return False, obj.get("content", ""), {"n_out": obj.get("tokens_predicted"), "draft_n": t.get("draft_n", 0),
                                                   "draft_n_accepted": t.get("draft_n_accepted", 0)}
        return True, obj.get("content", ""), None

    return loadgen.Api("/completion", body, parse)


def cell(run: Running, work: str, streams: int, gen: int, seed: int, timeout: float, bar) -> dict:
    n = 3 if streams == 1 else streams
    prompts = copy_prompts(n) if work == "copy" else loadgen.make_prompts(n)
    res, dur = loadgen.drive(run.port, api(gen, seed), prompts, streams, math.inf, seed, timeout,
                             on_done=lambda r: bar.update(1))
    s = loadgen.summarize(res, dur, gen)
    ok = [r for r in res if r.ok and r.final]
    dn = sum(int(r.final.get("draft_n") or 0) for r in ok)
    da = sum(int(r.final.get("draft_n_accepted") or 0) for r in ok)
    return {"tok_s": s["tok_per_s"], "ttft_p50": s["ttft_ms"][0], "itl_p50": s["itl_ms"][0], "itl_p99": s["itl_ms"][2],
            "accept": da / dn if dn else math.nan, "draft_n": dn, "errors": s["errors"], "md5": s["md5_all"]}


def run_config(srv, st: Settings, spec: str, args, bar, problems: list[str]) -> dict:
    srv.extra = list(srv.base_extra) + (["--spec-type", spec] if spec != "off" else [])
    out = {}
    with Running(srv, st) as run:
        try:
            warm_up(run, api(4, args.seed))
            for work in ("copy", "plain"):
                for c in [int(x) for x in args.streams.split(",")]:
                    gen = args.gen_wide if c >= 32 else args.gen
                    out[f"{work}/{c}"] = r = cell(run, work, c, gen, args.seed, args.timeout, bar)
                    problems += [f"{srv.name} {spec} {work}/{c}: {e}" for e in r["errors"][:3]]
        finally:
            problems += run.stop()
    return out


def med(xs):
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return float(np.median(xs)) if xs else math.nan


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tqdm, model, servers = pair_setup(args)
    for s in servers:
        s.base_extra = list(s.extra)
    streams = [int(x) for x in args.streams.split(",")]
    slots = max(streams)
    st = Settings(model=model, slots=slots, ctx=slots * 1024, threads=args.threads, flash_attn=args.flash_attn)
    types = [t for t in args.types.split(",") if t]
    per_cfg = 2 * sum(3 if c == 1 else c for c in streams)
    n_cfg = len(servers) * ((1 + len(types)) + (args.rounds - 1) * 2)
    bar = tqdm(total=n_cfg * per_cfg, unit="req", file=sys.stderr, mininterval=0.5, dynamic_ncols=True)
    runs: dict[tuple[str, str], list[dict]] = {}
    problems: list[str] = []
    best: dict[str, str] = {}
    try:
        for rnd in range(args.rounds):
            order = servers if rnd % 2 == 0 else servers[::-1]
            for srv in order:
                specs = ["off"] + (types if rnd == 0 else [best[srv.name]])
                for spec in specs:
                    bar.set_description(f"round {rnd + 1} {srv.name} {spec}")
                    runs.setdefault((srv.name, spec), []).append(run_config(srv, st, spec, args, bar, problems))
                if rnd == 0:
                    best[srv.name] = max(types, key=lambda t: runs[(srv.name, t)][0]["copy/1"]["tok_s"])
    finally:
        bar.close()
    keys = [f"{w}/{c}" for w in ("copy", "plain") for c in streams]

    def fig(name: str, spec: str, key: str, what: str) -> float:
        return med([r[key][what] for r in runs.get((name, spec), []) if key in r])

    rows = []
    for srv in servers:
        for spec in ("off", best[srv.name]):
            for key in keys:
                rows.append({"server": srv.name, "spec": spec, "cell": key,
                             **{w: fig(srv.name, spec, key, w) for w in ("tok_s", "ttft_p50", "itl_p50", "itl_p99", "accept")}})
    rs, ls = "ringserve", "llama-server"
    ratios = {}
    for key in keys:
        on = fig(rs, best.get(rs, "off"), key, "tok_s")
        ratios[key] = {"off": on / fig(rs, "off", key, "tok_s"),
                       "llama": on / fig(ls, best[ls], key, "tok_s") if ls in best else math.nan}
    goals = [{"cell": f"{w}/{c}", "vs": vs, "want": want, "got": ratios.get(f"{w}/{c}", {}).get(vs, math.nan)}
             for w, c, vs, want in GOALS if f"{w}/{c}" in ratios]
    for g in goals:
        g["met"] = bool(g["got"] >= g["want"]) if math.isfinite(g["got"]) else None
    out = sys.stderr if args.json else sys.stdout
    print(f"\nbest --spec-type: {best}   (model {os.path.basename(model)}, -t {args.threads}, gen {args.gen}"
          f"/{args.gen_wide} at 32, rounds {args.rounds})", file=out)
    print("| server | spec | cell | tok/s | TTFT p50 ms | ITL p50 ms | ITL p99 ms | accepted |", file=out)
    print("|---|---|---|---:|---:|---:|---:|---:|", file=out)
    for r in rows:
        acc = f"{100 * r['accept']:.0f}%" if math.isfinite(r["accept"]) else "-"
        print(f"| {r['server']} | {r['spec']} | {r['cell']} | {r['tok_s']:.1f} | {r['ttft_p50']:.0f} | "
              f"{r['itl_p50']:.1f} | {r['itl_p99']:.1f} | {acc} |", file=out)
    print("\n| cell | ringserve best / off | ringserve best / llama-server best |\n|---|---:|---:|", file=out)
    for key in keys:
        print(f"| {key} | {ratios[key]['off']:.2f}x | {ratios[key]['llama']:.2f}x |", file=out)
    print("\n| goal | want | got | met |\n|---|---:|---:|---|", file=out)
    for g in goals:
        print(f"| {g['cell']} vs {g['vs']} | {g['want']:.2f}x | {g['got']:.2f}x | {g['met']} |", file=out)
    if problems:
        print("\nproblems:\n" + "\n".join(problems[:20]), file=out)
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        f, ax = plt.subplots(figsize=(10, 4.5))
        labels = [(s.name, sp) for s in servers for sp in ("off", best[s.name])]
        w = 0.8 / len(labels)
        for i, (name, sp) in enumerate(labels):
            ax.bar(np.arange(len(keys)) + i * w, [fig(name, sp, k, "tok_s") for k in keys], w, label=f"{name} {sp}")
        ax.set_xticks(np.arange(len(keys)) + 0.4 - w / 2)
        ax.set_xticklabels(keys)
        ax.set_ylabel("tok/s (greedy)")
        ax.set_title("speculative decoding: workload/streams")
        ax.legend(fontsize=8)
        save_fig(f, args.plot)
    if args.json:
        print(json.dumps(_clean({"best": best, "rows": rows, "ratios": ratios, "goals": goals, "problems": problems})))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
