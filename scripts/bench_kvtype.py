#!/usr/bin/env python
"""KV cache type benchmark: f16 against q8_0 (-ctk/-ctv, -fa on), ringserve
against llama-server with the same flags, in one run.

Per concurrency c (each server's -np), KV type and server, on a fresh
server (scripts/bench_servers.py starts both with the same model, slots,
context, threads): decode tok/s (c streams of ~12-token prompts, --gen
tokens each, ignore_eos, closed loop: output tokens / wall time), prompt
tok/s (c requests of ~--prompt tokens, n_predict 1, cache_prompt false:
prompt tokens / wall time) and the peak summed PSS of the server's process
tree during the decode cell (scripts/_treemem.py), beside the KV size the
server reports (ringserve: /props kv_cache.bytes; llama-server: its
``llama_kv_cache: size`` log lines). Where c <= --fill-max, a fill cell
too: c prompts of ~3/4 of a slot's context, n_predict 1, and the tree's
PSS peak while they run: ringserve's KV is resident only where written
(engine/memory.py), llama-server's all along, so the decode cell's short
streams and the fill cell's long ones bound what each server holds.

A B A B: every round runs each (KV type, server) pair in turn, and each
ratio is the median over rounds of round r's pair (drift slower than a round
cancels, as in scripts/bench_serving.py).

  python scripts/bench_kvtype.py --plot docs/img/bench_kvtype.png   # full run (~8 min on 2 cores)
  python scripts/bench_kvtype.py --quick --json                     # the test suite's
"""
from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import sys

import loadgen
from _treemem import MemPeak
from bench_servers import LlamaServer, Ringserve, Running, Settings, add_server_args, llama_server_path
from bench_serving import MODES, _clean, bench_setup, default_model, save_fig
from frontends.testing import get

KV_TYPES = ("f16", "q8_0")
_KV_LOG = re.compile(r"llama_kv_cache: size =\s*([\d.]+) MiB")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("-m", "--model", default="", help="GGUF (default: ringserve's default model)")
    a("--concurrency", default="8,32", help="comma list; also each server's -np")
    a("--gen", type=int, default=96, help="tokens generated per decode request (ignore_eos)")
    a("--prompt", type=int, default=256, help="about this many tokens per prompt-throughput request")
    a("--ctx-slot", type=int, default=1024, help="context per slot (-c = c x this)")
    a("--kv", default=",".join(KV_TYPES), help="KV types compared (the first is the baseline)")
    a("--rounds", type=int, default=2, help="A B A B rounds")
    a("--fill-max", type=int, default=8, help="the fill cell (c prompts of 3/4 of a slot's context, PSS peak: "
      "every slot's KV written) runs where c <= this")
    a("-t", "--threads", type=int, default=2)
    add_server_args(a, timeout=900.0)
    a("--plot", default="", help="PNG: decode, prompt tok/s and PSS per cell")
    a("--json", action="store_true", help="JSON on stdout (the tables go to stderr)")
    a("--kv-in-cell-log", action="store_true", help="llama-server's cells at -lv 4, their KV size read from their "
      "own log (no separate -lv 4 start; its per-request logging then runs in the timed cells)")
    a("--servers", default="ringserve,llama-server", help="ringserve and/or llama-server (ringserve always runs)")
    a("--quick", action="store_true", help="one short round (c 2, gen 8, prompt 64, --kv-in-cell-log): "
      "completeness only")
    args = p.parse_args(argv)
    if args.quick:
        args.concurrency, args.gen, args.prompt, args.ctx_slot, args.rounds = "2", 8, 64, 256, 1
        args.kv_in_cell_log = True
    return args


def long_prompts(n: int, tokens: int, tag: str = "Record") -> list[str]:
    """n distinct prompts of about ``tokens`` tokens (~12 per sentence), none a prefix of another."""
    k = max(tokens // 12, 1)
    return [f"{tag} {i}. " + " ".join(f"Line {j} of record {i} notes value {(i * 31 + j) % 97}." for j in range(k))
            for i in range(n)]


def kv_mib(run: Running, probed: dict, in_log: bool = False) -> float:
    """The KV cache the server made, MiB: ringserve's /props; llama-server
    logs its ``llama_kv_cache: size`` lines only at -lv 4, which also logs
    per request, so a separate start with -lv 4 (once per settings) reads
    them; ``in_log`` (--kv-in-cell-log): this server runs at -lv 4, its own log."""
    if isinstance(run.server, Ringserve):
        code, body = get(f"{run.base}/props", 10.0)
        return json.loads(body)["kv_cache"]["bytes"] / 2**20 if code == 200 else float("nan")
    if in_log:
        return sum(float(m[1]) for m in _KV_LOG.finditer(run.log()))
    key = (shlex.join(run.server.extra), run.settings.slots)
    if key not in probed:
        probe = LlamaServer(run.server.path, run.server.extra + ["-lv", "4"])
        with Running(probe, run.settings) as p:
            probed[key] = sum(float(m[1]) for m in _KV_LOG.finditer(p.log()))
            p.stop()
    return probed[key]


def one_cell(srv, st: Settings, kv: str, args, bar, problems: list[str], commands: dict, probed: dict) -> dict:
    """Start one server, warm it, run the decode and the prompt cell, stop it."""
    c = st.slots
    greedy = MODES["greedy"]
    with Running(srv, st) as run:
        try:
            commands.setdefault(f"{srv.name} {kv}", shlex.join(run.cmd))
            warm = loadgen.stream_one(run.port, loadgen.native_api(4, greedy, 0, False), "Warm up: hello", 0, 120.0)
            if not warm.ok:
                raise RuntimeError(f"warm-up failed: {warm.error}\n{run.log_tail()}")
            mem = MemPeak(run.proc.pid)
            res, dur = loadgen.drive(run.port, loadgen.native_api(args.gen, greedy, 1234, False),
                                     loadgen.make_prompts(c), c, float("inf"), 1234, args.timeout,
                                     on_done=lambda _r: bar.update(1))
            pss, _ = mem.stop()
            dec = loadgen.summarize(res, dur, args.gen)
            pres, pdur = loadgen.drive(run.port, loadgen.native_api(1, greedy, 1234, False),
                                       long_prompts(c, args.prompt), c, float("inf"), 1234, args.timeout,
                                       on_done=lambda _r: bar.update(1))
            n_prompt = sum(r.n_prompt for r in pres if r.ok)
            full, fres = float("nan"), []
            if c <= args.fill_max:  # every slot's context ~3/4 written: what is resident when streams are long
                mem = MemPeak(run.proc.pid)
                fres, _ = loadgen.drive(run.port, loadgen.native_api(1, greedy, 1234, False),
                                        long_prompts(c, args.ctx_slot * 3 // 4, "Full"), c, float("inf"), 1234,
                                        args.timeout, on_done=lambda _r: bar.update(1))
                full, _ = mem.stop()
            mib = kv_mib(run, probed, args.kv_in_cell_log) if isinstance(srv, Ringserve) or args.kv_in_cell_log \
                else None
            problems += run.stop()  # before a llama-server KV probe starts beside it
            mib = kv_mib(run, probed) if mib is None else mib
            errors = dec["errors"] + [f"prompt #{r.index}: {r.error}" for r in pres if not r.ok] + [
                f"fill #{r.index}: {r.error}" for r in fres if not r.ok]
            problems += [f"{srv.name} {kv} c={c}: {e}" for e in errors[:5]]
            return {"server": srv.name, "kv": kv, "concurrency": c, "decode_tok_s": dec["tok_per_s"],
                    "prompt_tok_s": n_prompt / pdur if pdur > 0 else float("nan"), "prompt_tokens": n_prompt,
                    "pss_mib": pss, "pss_full_mib": full, "kv_mib": mib, "completed": dec["completed"],
                    "requests": dec["requests"], "errors": errors}
        finally:
            problems += run.stop()


FIGS = ("decode_tok_s", "prompt_tok_s", "pss_mib", "pss_full_mib", "kv_mib")


def summarize(cells: list[dict], servers: list[str], kvs: list[str], concs: list[int]) -> tuple[list, list]:
    """Medians per (c, server, kv), and the median per-round ratios: each KV
    type against the first, ringserve against llama-server."""
    def ratio(a: list[dict], b: list[dict], f: str) -> float:
        xs = [x[f] / y[f] for x, y in zip(a, b) if y[f]]
        return statistics.median(xs) if xs else float("nan")

    def pick(c, s, kv):
        return sorted((x for x in cells if (x["concurrency"], x["server"], x["kv"]) == (c, s, kv)),
                      key=lambda x: x["round"])

    rows, ratios = [], []
    for c in concs:
        for s in servers:
            for kv in kvs:
                xs = pick(c, s, kv)
                if xs:
                    rows.append({"concurrency": c, "server": s, "kv": kv,
                                 **{f: statistics.median(x[f] for x in xs) for f in FIGS}})
        for s in servers:  # KV type against the baseline, per server
            for kv in kvs[1:]:
                a, b = pick(c, s, kv), pick(c, s, kvs[0])
                if a and b:
                    ratios.append({"concurrency": c, "what": f"{s}: {kv} / {kvs[0]}",
                                   **{f: ratio(a, b, f) for f in FIGS}})
        if len(servers) > 1:
            for kv in kvs:  # ringserve against llama-server, per KV type
                a, b = pick(c, servers[0], kv), pick(c, servers[1], kv)
                if a and b:
                    ratios.append({"concurrency": c, "what": f"{kv}: {servers[0]} / {servers[1]}",
                                   **{f: ratio(a, b, f) for f in FIGS}})
    return rows, ratios


def print_tables(rows: list[dict], ratios: list[dict], out) -> None:
    print("| c | server | KV | decode tok/s | prompt tok/s | PSS MiB (peak, tree) | PSS MiB, slots 3/4 full "
          "| KV MiB |", file=out)
    print("|---|---|---|---|---|---|---|---|", file=out)
    for r in rows:
        print(f"| {r['concurrency']} | {r['server']} | {r['kv']} | {r['decode_tok_s']:.1f} | {r['prompt_tok_s']:.0f} "
              f"| {r['pss_mib']:.0f} | {r['pss_full_mib']:.0f} | {r['kv_mib']:.1f} |", file=out)
    print("\n| c | ratio (median of rounds) | decode | prompt | PSS | PSS, slots 3/4 full | KV |", file=out)
    print("|---|---|---|---|---|---|---|", file=out)
    for r in ratios:
        print(f"| {r['concurrency']} | {r['what']} | {r['decode_tok_s']:.3f} | {r['prompt_tok_s']:.3f} "
              f"| {r['pss_mib']:.3f} | {r['pss_full_mib']:.3f} | {r['kv_mib']:.3f} |", file=out)


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    labels = sorted({(r["concurrency"], r["kv"]) for r in rows})
    servers = list(dict.fromkeys(r["server"] for r in rows))
    w = 0.8 / max(len(servers), 1)
    for ax, (f, title) in zip(axes, (("decode_tok_s", "decode tok/s"), ("prompt_tok_s", "prompt tok/s"),
                                     ("pss_mib", "PSS of the tree, MiB (peak)"))):
        for i, s in enumerate(servers):
            ys = [next((r[f] for r in rows if (r["concurrency"], r["kv"], r["server"]) == (c, kv, s)), 0)
                  for c, kv in labels]
            ax.bar([j + i * w for j in range(len(labels))], ys, w, label=s)
        ax.set_xticks([j + w * (len(servers) - 1) / 2 for j in range(len(labels))])
        ax.set_xticklabels([f"c={c}\n{kv}" for c, kv in labels])
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend()
    fig.suptitle("KV cache type: f16 vs q8_0 (-fa on), ringserve vs llama-server")
    save_fig(fig, path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tqdm = bench_setup()
    model = args.model or default_model()
    path = (args.llama_server or llama_server_path()) if "llama-server" in args.servers else ""
    kvs = [k.strip() for k in args.kv.split(",") if k.strip()]
    concs = [int(x) for x in args.concurrency.split(",") if x.strip()]

    def servers_for(kv: str) -> list:
        flags = ["-ctk", kv, "-ctv", kv]
        out = [Ringserve(flags + shlex.split(args.ringserve_args))]
        if path:
            lv = ["-lv", "4"] if args.kv_in_cell_log else []  # its KV size lines in its own log
            out.append(LlamaServer(path, flags + lv + shlex.split(args.llama_server_args)))
        return out

    names = [s.name for s in servers_for(kvs[0])]
    cells: list[dict] = []
    problems: list[str] = [] if path or "llama-server" not in args.servers else [
        "llama-server not built (scripts/build_llama_server.sh): ringserve only"]
    commands: dict[str, str] = {}
    probed: dict = {}
    per_round = sum(2 * c + (c if c <= args.fill_max else 0) for c in concs)  # decode, prompt, fill cells
    bar = tqdm(total=per_round * len(kvs) * len(names) * args.rounds, unit="req", file=sys.stderr,
               mininterval=0.5, dynamic_ncols=True)
    try:
        for rnd in range(args.rounds):
            for c in concs:
                st = Settings(model=model, slots=c, ctx=args.ctx_slot * c, threads=args.threads, flash_attn="on")
                for kv in kvs:  # A B A B: KV types and servers take turns inside every round
                    for srv in servers_for(kv):
                        bar.set_description(f"r{rnd + 1} c={c} {kv} {srv.name}")
                        try:
                            cells.append({**one_cell(srv, st, kv, args, bar, problems, commands, probed), "round": rnd})
                        except RuntimeError as e:
                            problems.append(f"{srv.name} {kv} c={c} r{rnd + 1}: {e}")
                            bar.write(problems[-1], file=sys.stderr)
    except KeyboardInterrupt as e:
        problems.append(f"interrupted by {e or 'SIGINT'}")
    finally:
        bar.close()
    rows, ratios = summarize(cells, names, kvs, concs)
    out = sys.stderr if args.json else sys.stdout
    print_tables(rows, ratios, out)
    for pr in problems:
        print(f"problem: {pr}", file=out)
    if args.plot:
        plot(rows, args.plot)
        print(f"plot: {args.plot}", file=out)
    ok = bool(cells) and all(x["completed"] == x["requests"] and not x["errors"] for x in cells) and not [
        p for p in problems if not p.startswith("llama-server not built")]
    if args.json:
        settings = {k: v for k, v in vars(args).items() if k not in ("json", "plot")}
        doc = {"ok": ok, "model": model, "servers": names, "kv": kvs, "settings": settings, "commands": commands,
               "summary": rows, "ratios": ratios, "cells": cells, "problems": problems}
        json.dump(_clean(doc), sys.stdout, indent=1, allow_nan=False)
        print()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
