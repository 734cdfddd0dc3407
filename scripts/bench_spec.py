#!/usr/bin/env python
"""Speculative decoding benchmark: ringserve against llama-server, speculation off and on.

Two workloads over /completion (greedy, ignore_eos, cache_prompt off, every
prompt distinct): (a) ``copy``, input copying: a passage of code followed by
its first 3 lines again, which a base model continues by copying it (an
agent rewriting a file with few changes), ``--gen-copy`` tokens per request
(256: less than the rest of every passage, so the output is the rewrite and
not what the model writes past its end). The passages are frozen in
scripts/data/copy_passages.json (whole lines of this repository's engine/
and ipc/ sources from a ``def`` or ``class`` line, >= 1200 characters,
317-507 tokens, round-robin over the files; the rule and commit are in the
file): the inputs do not move with the sources, and a passage starts in
code, not in a module docstring that the 270M model rewraps as prose;
(b) ``plain``, ordinary short prompts, ``--gen`` tokens. Each at 1, 4
and 32 concurrent streams (``--gen-wide`` tokens at 32), closed loop: 3
requests at one stream, 3 per stream at 4, two per stream at 32, --waves-wide
(``n_requests``). First a probe:
each server with each of its n-gram ``--spec-type`` values (ringserve's
and all of llama-server's: ngram-simple, ngram-map-k, ngram-map-k4v,
ngram-mod, ngram-cache; no draft model needed) on the copy cell at one
stream (``--probe-rounds``, median); a server's best type is the one with
the highest tok/s there. Then ``--rounds`` rounds over every cell with
each server off and with its best type. Every configuration compared is
up at once (idle ones take no CPU: printed) and they take turns cell by
cell, A B B A (the order reverses at each cell and each round), so two
figures compared were measured seconds apart: this VM's speed drifts by
~10% over minutes. Figures are medians over rounds (each configuration's
per round printed too); the ratios compare ringserve's best with
ringserve off and with llama-server's best.

tok/s = output tokens / wall time of the cell (TTFT included: the issue's
figure, the goals use it); dec tok/s = streams x output tokens after the
first / the requests' time after their first token (decode alone); TTFT and
ITL p50/p99 from the SSE events; accepted = draft_n_accepted / draft_n from
the final events' timings.

``--draft GGUF`` gives every type naming draft-simple ``-md GGUF`` on both
servers: the draft-model path side by side (no probe over n-gram types then
unless --types names them).

  python scripts/bench_spec.py --plot docs/img/bench_spec.png   # full run (2 rounds: ~16 min on the AVX-512 VM, 40 on the AVX2 one)
  python scripts/bench_spec.py --quick --json                   # the test suite's (one request a cell)
  python scripts/bench_spec.py --aa --servers ringserve --rounds 4  # A/A: the spread of a ratio of equals
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys

import numpy as np

import loadgen
from bench_servers import Running, Settings, add_server_args
from bench_serving import _clean, cpu_by_role, pair_setup, save_fig, warm_up
from engine.spec import TYPES as SPEC_TYPES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PASSAGES = os.path.join(ROOT, "scripts", "data", "copy_passages.json")
GOALS = (("copy", 1, "off", 1.8), ("copy", 1, "llama", 1.1), ("copy", 4, "off", 1.3),
         ("plain", 1, "off", 0.97), ("plain", 4, "off", 0.97), ("plain", 32, "off", 0.97),
         ("copy", 32, "off", 0.97))
# every n-gram type each server runs (no draft model needed): the best must be each one's real best
# (ringserve's ngram-short is meant to follow ngram-map-k: probed in that chain)
TYPES = {"ringserve": [t for t in SPEC_TYPES if t.startswith("ngram") and t != "ngram-short"] + ["ngram-map-k,ngram-short"],
         "llama-server": ["ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"]}
FIGS = ("tok_s", "dec_tok_s", "ttft_p50", "itl_p50", "itl_p99", "accept")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("-m", "--model", default="", help="GGUF (default: ringserve's default model)")
    a("--servers", default="ringserve,llama-server", help="ringserve and/or llama-server")
    a("--types", default="", help="--spec-type values probed per server, comma-separated, or ';'-separated "
      "to name a chain (default: every n-gram type it runs)")
    a("--streams", default="1,4,32", help="concurrent streams per cell")
    a("--gen", type=int, default=96, help="tokens per plain request")
    a("--gen-copy", type=int, default=256, help="tokens per copy request (the rest of its passage)")
    a("--gen-wide", type=int, default=48, help="tokens per request at 32 streams")
    a("-t", "--threads", type=int, default=2)
    a("-fa", "--flash-attn", default="auto", choices=("on", "off", "auto"))
    a("--rounds", type=int, default=2, help="A B B A rounds after the probe")
    a("--probe-rounds", type=int, default=2, help="A B B A rounds of the probe (its figure: the median)")
    a("--requests", type=int, default=3, help="requests per cell at one stream, and per stream up to 4 streams "
      "(--waves-wide per stream beyond: n_requests)")
    a("--waves-wide", type=int, default=2, help="requests per stream beyond 4 streams (closed loop)")
    a("--seed", type=int, default=1234)
    a("--draft", default="", help="draft model GGUF: every type naming draft-simple runs with -md DRAFT on both "
      "servers (e.g. -m SmolLM2 --draft SmolLM2 --types draft-simple: the draft path's mechanics)")
    add_server_args(a, timeout=300.0)
    a("--plot", default="", help="PNG: tok/s per cell, each server off and with its best type")
    a("--json", action="store_true", help="JSON on stdout (the tables go to stderr)")
    a("--aa", action="store_true", help="A/A instead: the first of --servers off against an identical second one "
      "off, the same cells and turns (what the bench reads for no difference; no probe)")
    a("--quick", action="store_true", help="one round, one stream, one request a cell, short outputs: completeness only")
    args = p.parse_args(argv)
    if args.quick:
        args.streams, args.gen, args.gen_copy, args.gen_wide, args.rounds, args.requests = "1", 24, 24, 16, 1, 1
        args.waves_wide = 1
        args.probe_rounds = 1
        args.types = args.types or "ngram-simple"
    return args


def copy_prompts(n: int) -> list[str]:
    """n distinct copy prompts: passages of code (PASSAGES), then their first 3 lines again."""
    with open(PASSAGES) as f:
        passages = [p["text"] for p in json.load(f)["passages"]]
    if n > len(passages):
        raise SystemExit(f"{n} copy prompts wanted, {PASSAGES} has {len(passages)}")
    out = []
    for text in passages[:n]:
        lines = text.split("\n")
        out.append(text + "\n\n# ---- a copy of the code above ----\n" + "\n".join(lines[:3]) + "\n")
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


def gen_for(args, work: str, streams: int) -> int:
    return args.gen_wide if streams >= 32 else args.gen_copy if work == "copy" else args.gen


def n_requests(streams: int, at_one: int = 3, wide: int = 2) -> int:
    """Requests in a cell: ``at_one`` (--requests) at one stream, as many per stream (closed loop, one
    after another) up to 4 streams, ``wide`` (--waves-wide) per stream beyond. Why per stream: a cell of
    one request per stream ends with its slowest request, so its tok/s is that one's (with speculation the
    streams part: the predictable ones finish early), and it moved 0.94x-1.14x between runs at 4 streams;
    three waves make it a sustained rate. At 32 streams one wave (32 requests, ~8 s) read 0.93x and 0.96x
    for a server against an identical one (the A/A in docs/PERFORMANCE.md): two waves by default."""
    return at_one if streams == 1 else streams * (at_one if streams <= 4 else wide)


def cell(run: Running, work: str, streams: int, n: int, gen: int, seed: int, timeout: float, bar) -> dict:
    prompts = copy_prompts(n) if work == "copy" else loadgen.make_prompts(n)
    res, dur = loadgen.drive(run.port, api(gen, seed), prompts, streams, math.inf, seed, timeout,
                             on_done=lambda r: bar.update(1))
    s = loadgen.summarize(res, dur, gen)
    ok = [r for r in res if r.ok and r.final]
    dn = sum(int(r.final.get("draft_n") or 0) for r in ok)
    da = sum(int(r.final.get("draft_n_accepted") or 0) for r in ok)
    dec = [(r.n_out - 1, r.latency - r.ttft) for r in ok if r.n_out > 1 and math.isfinite(r.ttft)]
    dec_s = sum(t for _, t in dec)
    return {"tok_s": s["tok_per_s"], "dec_tok_s": streams * sum(k for k, _ in dec) / dec_s if dec_s > 0 else math.nan,
            "ttft_p50": s["ttft_ms"][0], "itl_p50": s["itl_ms"][0], "itl_p99": s["itl_ms"][2],
            "accept": da / dn if dn else math.nan, "draft_n": dn, "errors": s["errors"], "md5": s["md5_all"]}


def configured(srv, spec: str, args):
    """A copy of ``srv`` that starts with ``spec`` ("off": none), so several configurations can be up at once."""
    out = copy.copy(srv)
    out.extra = list(srv.base_extra) + (["--spec-type", spec] if spec != "off" else [])
    if args.draft and "draft-simple" in spec.split(","):
        out.extra += ["-md", args.draft]
    return out


def tree_cpu(run: Running) -> float:
    """CPU seconds (user + system) of a server's whole process tree so far."""
    return sum(cpu_by_role(run.proc.pid, False).values())


def interleave(configs: list[tuple], cells: list[tuple[str, int]], rounds: int, st: Settings, args, bar,
               problems: list[str], idle: list[float]) -> dict[tuple[str, str], list[dict]]:
    """Every (server, spec) of ``configs`` started and warmed up at once, then per round and per cell each
    configuration in turn, A B B A (the order reverses from one cell to the next and from one round to the
    next), so the figures compared were measured seconds apart, not a server's run of every cell apart:
    this VM's speed drifts by ~10% over minutes (a type that drafts nothing on plain prompts read 0.91x
    off when each configuration ran all its cells in one go). An idle server takes no CPU (its threads wait
    on a condition or a semaphore); ``idle`` gets what the others used during each cell, to show it.
    Returns (server name, spec) -> per round {"work/streams": cell figures}; every server is stopped."""
    out: dict[tuple[str, str], list[dict]] = {(s.name, sp): [] for s, sp in configs}
    live: list[tuple[tuple[str, str], Running]] = []
    try:
        for srv, spec in configs:
            bar.set_description(f"start {srv.name} {spec}")
            run = Running(configured(srv, spec, args), st)
            live.append(((srv.name, spec), run))
            warm_up(run, api(4, args.seed))
        for rnd in range(rounds):
            got: dict[tuple[str, str], dict] = {k: {} for k, _ in live}
            for i, (work, c) in enumerate(cells):
                for k, run in live if (rnd + i) % 2 == 0 else live[::-1]:
                    others = [r for _, r in live if r is not run]
                    c0 = sum(tree_cpu(o) for o in others)
                    bar.set_description(f"round {rnd + 1} {work}/{c} {k[0]} {k[1]}")
                    n = n_requests(c, args.requests, args.waves_wide)
                    got[k][f"{work}/{c}"] = r = cell(run, work, c, n, gen_for(args, work, c), args.seed, args.timeout, bar)
                    idle.append(sum(tree_cpu(o) for o in others) - c0)
                    problems += [f"{k[0]} {k[1]} {work}/{c}: {e}" for e in r["errors"][:3]]
            for k, res in got.items():
                out[k].append(res)
    finally:
        for _, run in live:
            problems += run.stop()
    return out


def med(xs):
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return float(np.median(xs)) if xs else math.nan


def aa(srv, cells, st: Settings, args, bar, problems: list[str], idle: list[float]) -> int:
    """--aa: two identical servers (``srv`` off, twice) through ``interleave``; prints B / A per cell
    (ratio of medians, and the per-round pairs): the spread a real ratio must clear."""
    twin = copy.copy(srv)
    twin.name = srv.name + "-B"
    try:
        runs = interleave([(srv, "off"), (twin, "off")], cells, args.rounds, st, args, bar, problems, idle)
    finally:
        bar.close()
    a, b = runs[(srv.name, "off")], runs[(twin.name, "off")]
    out, rows = sys.stderr if args.json else sys.stdout, {}
    print(f"\nA/A: {srv.name} off against an identical {twin.name} off, rounds {args.rounds}, "
          f"{args.waves_wide} waves beyond 4 streams\n| cell | B / A, ratio of medians | per-round pairs |\n|---|---:|---|",
          file=out)
    for w, c in cells:
        k = f"{w}/{c}"
        pairs = [y[k]["tok_s"] / x[k]["tok_s"] for x, y in zip(a, b) if k in x and k in y]
        rows[k] = {"ratio": med([y[k]["tok_s"] for y in b]) / med([x[k]["tok_s"] for x in a]), "pairs": pairs}
        print(f"| {k} | {rows[k]['ratio']:.3f} | " + ", ".join(f"{x:.2f}" for x in pairs) + " |", file=out)
    return finish(args, out, problems, {"aa": rows, "idle_cpu_s": idle})


def finish(args, out, problems: list[str], doc: dict) -> int:
    """A run's end, a full run's or --aa's: its problems on ``out``, ``doc`` as JSON on stdout
    (--json, with the problems); 1 if there were any."""
    if problems:
        print("\nproblems:\n" + "\n".join(problems[:20]), file=out)
    if args.json:
        print(json.dumps(_clean({**doc, "problems": problems})))
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tqdm, model, servers = pair_setup(args)
    for s in servers:
        s.base_extra = list(s.extra)
    streams = [int(x) for x in args.streams.split(",")]
    slots = max(streams)
    st = Settings(model=model, slots=slots, ctx=slots * 1024, threads=args.threads, flash_attn=args.flash_attn)
    sep = ";" if ";" in args.types else ","  # ";" lets a value chain types, as spec_profile.py's --spec
    types = {s.name: [t for t in args.types.split(sep) if t] or TYPES[s.name] for s in servers}
    cells = [(w, c) for w in ("copy", "plain") for c in streams]
    probe = [("copy", 1)]
    per_cfg = sum(n_requests(c, args.requests, args.waves_wide) for _, c in cells)
    n_probe = sum(len(t) for t in types.values() if len(t) > 1) * n_requests(1, args.requests) * args.probe_rounds
    if args.aa:
        n_probe, servers = 0, servers[:1]
    bar = tqdm(total=n_probe + args.rounds * len(servers) * 2 * per_cfg, unit="req", file=sys.stderr,
               mininterval=0.5, dynamic_ncols=True)
    runs: dict[tuple[str, str], list[dict]] = {}
    probes: dict[tuple[str, str], float] = {}  # (server, type) -> copy/1 tok/s in the probe (median over its rounds)
    problems: list[str] = []
    idle: list[float] = []  # CPU seconds the idle servers took during each cell
    best: dict[str, str] = {}
    if args.aa:
        return aa(servers[0], cells, st, args, bar, problems, idle)
    try:
        for srv in servers:  # the probe: each type on the copy cell at one stream, all of one server's up at once
            ts = types[srv.name]
            if len(ts) > 1:
                got = interleave([(srv, t) for t in ts], probe, args.probe_rounds, st, args, bar, problems, idle)
                probes.update({k: med([r["copy/1"]["tok_s"] for r in rs if "copy/1" in r]) for k, rs in got.items()})
            best[srv.name] = max(ts, key=lambda t: probes.get((srv.name, t), 0.0))
        order = [(srv, spec) for srv in servers for spec in ("off", best[srv.name])]
        runs = interleave(order, cells, args.rounds, st, args, bar, problems, idle)
    finally:
        bar.close()
    keys = [f"{w}/{c}" for w, c in cells]

    def fig(name: str, spec: str, key: str, what: str) -> float:
        return med([r[key][what] for r in runs.get((name, spec), []) if key in r])

    rows = []
    for srv in servers:
        for spec in ("off", best[srv.name]):
            for key in keys:
                rows.append({"server": srv.name, "spec": spec, "cell": key, **{w: fig(srv.name, spec, key, w) for w in FIGS}})
    rs, ls = "ringserve", "llama-server"
    ratios = {}
    for key in keys:
        on, dec = fig(rs, best.get(rs, "off"), key, "tok_s"), fig(rs, best.get(rs, "off"), key, "dec_tok_s")
        ratios[key] = {"off": on / fig(rs, "off", key, "tok_s"),
                       "llama": on / fig(ls, best[ls], key, "tok_s") if ls in best else math.nan,
                       "dec_off": dec / fig(rs, "off", key, "dec_tok_s"),
                       "dec_llama": dec / fig(ls, best[ls], key, "dec_tok_s") if ls in best else math.nan}
    goals = [{"cell": f"{w}/{c}", "vs": vs, "want": want, "got": ratios.get(f"{w}/{c}", {}).get(vs, math.nan)}
             for w, c, vs, want in GOALS if f"{w}/{c}" in ratios]
    for g in goals:
        g["met"] = bool(g["got"] >= g["want"]) if math.isfinite(g["got"]) else None
    out = sys.stderr if args.json else sys.stdout
    print(f"\nbest --spec-type: {best}   (model {os.path.basename(model)}, -t {args.threads}, gen copy {args.gen_copy}"
          f" / plain {args.gen} / {args.gen_wide} at 32 streams, rounds {args.rounds})", file=out)
    if probes:
        print("\nprobe, copy/1 tok/s per --spec-type:\n| server | " + " | ".join(sorted({t for _, t in probes}))
              + " |\n|---|" + "---:|" * len({t for _, t in probes}), file=out)
        for srv in servers:
            print(f"| {srv.name} | " + " | ".join(f"{probes[(srv.name, t)]:.1f}" if (srv.name, t) in probes else "-"
                                               for t in sorted({t for _, t in probes})) + " |", file=out)
    print("\n| server | spec | cell | tok/s | dec tok/s | TTFT p50 ms | ITL p50 ms | ITL p99 ms | accepted |", file=out)
    print("|---|---|---|---:|---:|---:|---:|---:|---:|", file=out)
    for r in rows:
        acc = f"{100 * r['accept']:.0f}%" if math.isfinite(r["accept"]) else "-"
        print(f"| {r['server']} | {r['spec']} | {r['cell']} | {r['tok_s']:.1f} | {r['dec_tok_s']:.1f} | "
              f"{r['ttft_p50']:.0f} | {r['itl_p50']:.1f} | {r['itl_p99']:.1f} | {acc} |", file=out)
    print("\n| cell | ringserve best / off | ringserve best / llama-server best | decode: / off | decode: / llama-server |"
          "\n|---|---:|---:|---:|---:|", file=out)
    for key in keys:
        r = ratios[key]
        print(f"| {key} | {r['off']:.2f}x | {r['llama']:.2f}x | {r['dec_off']:.2f}x | {r['dec_llama']:.2f}x |", file=out)
    # each configuration's tok/s per round, in the order run (A B B A): a median's spread on the page
    per_round = {f"{srv.name} {sp} {k}": [r[k]["tok_s"] if k in r else math.nan for r in runs.get((srv.name, sp), [])]
                 for srv, sp in order for k in keys}
    print("\n| tok/s per round | " + " | ".join(f"r{i + 1}" for i in range(args.rounds)) + " |\n|---|"
          + "---:|" * args.rounds, file=out)
    for name, xs in per_round.items():
        print(f"| {name} | " + " | ".join(f"{x:.1f}" for x in xs) + " |", file=out)
    print("\n| goal (tok/s, TTFT included) | want | got | met |\n|---|---:|---:|---|", file=out)
    for g in goals:
        print(f"| {g['cell']} vs {g['vs']} | {g['want']:.2f}x | {g['got']:.2f}x | {g['met']} |", file=out)
    if idle:
        print(f"\nidle servers' CPU during a cell (the others, up at once): median {med(idle):.2f} s, max {max(idle):.2f} s"
              f" over {len(idle)} cells", file=out)
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
    probed = {f"{k[0]} {k[1]}": v for k, v in probes.items()}
    return finish(args, out, problems, {"best": best, "probes": probed, "rows": rows, "ratios": ratios,
                                        "goals": goals, "per_round": per_round, "idle_cpu_s": idle})


if __name__ == "__main__":
    sys.exit(main())
