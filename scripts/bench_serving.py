#!/usr/bin/env python
"""Serving benchmark: ringserve against llama-server and llama-cpp-python's
server, side by side in one run, with vLLM ``bench serve`` metrics.

Every server is started here on a free 127.0.0.1 port with the same model,
slots (-np = concurrency), context, threads and flash-attention setting
(scripts/bench_servers.py), warmed with one short request, and driven with
streaming requests (scripts/loadgen.py): ~12-token prompts distinct per
request, --gen tokens each with ignore_eos, cache_prompt off, greedy and/or
sampled with a per-request seed; closed loop at each concurrency, or Poisson
arrivals with --request-rate.

Why A B A B: on a shared, noisy machine two runs of one server differ by up
to ~8%, so for each concurrency the servers take turns (--rounds) and each
ratio is ringserve's round r over the other's round r, the median of those
pairs reported: drift slower than a round cancels.

Beside the throughput, ringserve's engine phase tracer (/metrics,
``ringserve:engine_phase_seconds_total``) is diffed around each of its cells:
ms per decode step in intake, build, decode, sample, publish, and the host
share of the step, i.e. where the time goes that is not llama_decode.

  python scripts/bench_serving.py --plot bench.png        # full run
  python scripts/bench_serving.py --quick --json          # the test suite's
"""
from __future__ import annotations

import argparse
import json
import math
import shlex
import signal
import subprocess
import sys
import numpy as np

import loadgen
from bench_servers import (ROOT, LlamaCppPython, LlamaServer, Ringserve, Running, Settings,
                           add_server_args, lcp_available, llama_server_path)
from bench_report import phase_rows, phases, plot, print_tables, summary_rows

MODES = {
    "greedy": {"temperature": 0.0, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0},
    "sampled": {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0},
}


def default_model() -> str:
    out = subprocess.run([sys.executable, "-c", "from engine.config import Config; print(Config().model_path())"],
                         cwd=ROOT, capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def eog_bias(model: str) -> dict[str, float]:
    """-1e9 on every end-of-generation token: ignore_eos for an API without it.
    The vocabulary comes from engine/vocab.py (a ModelError if it cannot load);
    its log sink passes on errors only, keeping llama.cpp's loader chatter out."""
    import logging

    from engine.vocab import Vocab, init_backend

    init_backend(forward=logging.ERROR)
    with Vocab.load(model) as v:
        return {str(t): -1e9 for t in v.eog_ids.tolist()}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("-m", "--model", default="", help="GGUF (default: ringserve's default model)")
    a("--servers", default="", help="comma list of ringserve,llama-server,llama-cpp-python (default: all available)")
    a("--concurrency", default="1,8,32", help="comma list; also each server's -np")
    a("--gen", type=int, default=128, help="tokens generated per request (ignore_eos)")
    a("--sampling", choices=("greedy", "sampled", "both"), default="both")
    a("--rounds", type=int, default=2, help="A B A B rounds per concurrency")
    a("--num-prompts", type=int, default=0, help="requests per cell (default: max(2 x concurrency, 4))")
    a("--request-rate", type=float, default=math.inf, help="Poisson arrivals/s (default inf: closed loop)")
    a("-c", "--ctx-size", type=int, default=0, help="total context (default: 512 per slot)")
    a("-t", "--threads", type=int, default=2)
    a("-fa", "--flash-attn", default="auto", choices=("on", "off", "auto"))
    a("--swa-full", action=argparse.BooleanOptionalAction, default=True,
      help="--swa-full to both (ringserve's fixed setting); --no-swa-full: llama-server's default cache")
    a("--seed", type=int, default=1234, help="request i gets seed + i; also the arrival process's seed")
    a("--cache-prompt", action="store_true", help="send cache_prompt true (default false on both)")
    a("--lcp-max-concurrency", type=int, default=8,
      help="skip llama-cpp-python above this (it serves one request at a time)")
    add_server_args(a, timeout=900.0)
    a("--plot", default="", help="PNG: tokens/s and TTFT against concurrency")
    a("--json", action="store_true", help="JSON on stdout (the tables go to stderr)")
    a("--one-start", action="store_true",
      help="start each server once per round with -np = the largest concurrency and run every concurrency on it")
    a("--quick", action="store_true", help="one short round (c 1 and 4, gen 8, --one-start, max(c, 2) requests "
      "a cell): completeness only")
    args = p.parse_args(argv)
    if args.quick:
        args.concurrency, args.gen, args.rounds, args.one_start = "1,4", 8, 1, True
        args.servers = args.servers or "ringserve,llama-server"
    return args


def pick_servers(args: argparse.Namespace) -> list:
    """The servers to run, ringserve first (ratios are against it)."""
    want = [s.strip() for s in args.servers.split(",") if s.strip()] or ["ringserve", "llama-server", "llama-cpp-python"]
    explicit = bool(args.servers) and not args.quick
    out = [Ringserve(shlex.split(args.ringserve_args))]
    if "llama-server" in want:
        path = args.llama_server or llama_server_path()
        if path:
            out.append(LlamaServer(path, shlex.split(args.llama_server_args)))
        elif explicit:
            sys.exit("llama-server not built: run scripts/build_llama_server.sh or pass --llama-server")
    if "llama-cpp-python" in want:
        if lcp_available():
            out.append(LlamaCppPython([]))
        elif explicit:
            sys.exit("llama_cpp.server extras missing: pip install fastapi uvicorn sse-starlette "
                     "starlette-context pydantic-settings")
    if "ringserve" not in want:
        out = out[1:]
    return out


def api_for(server, args: argparse.Namespace, mode: str, bias: dict, gen: int = 0) -> loadgen.Api:
    samp = MODES[mode]
    if server.api == "native":
        return loadgen.native_api(gen or args.gen, samp, args.seed, args.cache_prompt)
    return loadgen.openai_api(gen or args.gen, samp, args.seed, bias)


def warm_up(run: Running, api: loadgen.Api) -> None:
    """One short untimed request: the first decode allocates compute buffers."""
    r = loadgen.stream_one(run.port, api, "Warm up: hello", 0, 120.0)
    if not r.ok:
        raise RuntimeError(f"{run.server.name} warm-up failed: {r.error}\n{run.log_tail()}")


def one_server(srv, st: Settings, loads: list[tuple[int, list[str]]], rnd: int, modes: list[str],
               args: argparse.Namespace, bias: dict, bar, problems: list[str], commands: dict) -> list[dict]:
    """Start one server (-np = its concurrency; --one-start: the largest of
    ``loads``), warm it, run each (concurrency, prompts) load's sampling
    modes' cells on it, stop it. Raises RuntimeError if it cannot serve."""
    cells = []
    with Running(srv, st) as run:
        try:
            if srv.name not in commands:
                commands[srv.name] = run.cmd
                bar.write(f"{srv.name}: {shlex.join(run.cmd)}", file=sys.stderr)
            warm_up(run, api_for(srv, args, modes[0], bias, gen=4))
            for (c, prompts), mode in ((ld, m) for ld in loads for m in modes):
                bar.set_description(f"c={c} r{rnd + 1} {srv.name} {mode}")
                m0 = run.metrics() if isinstance(srv, Ringserve) else {}
                cpu0 = cpu_by_role(run.proc.pid, isinstance(srv, Ringserve))
                res, dur = loadgen.drive(run.port, api_for(srv, args, mode, bias), prompts, c, args.request_rate,
                                         args.seed + rnd, args.timeout, on_done=lambda _r: bar.update(1))
                cpu1 = cpu_by_role(run.proc.pid, isinstance(srv, Ringserve))
                m1 = run.metrics() if isinstance(srv, Ringserve) else {}
                cell = {"server": srv.name, "mode": mode, "concurrency": c, "round": rnd,
                        **loadgen.summarize(res, dur, args.gen), "phases": phases(m0, m1), "_raw": res}
                n_out = max(cell["output_tokens"], 1)
                cell["cpu_ms_per_token"] = {k: 1e3 * (cpu1.get(k, 0.0) - v) / n_out for k, v in cpu0.items()}
                cells.append(cell)
                problems += [f"{srv.name} c={c} r{rnd + 1} {mode} {e}" for e in cell["errors"][:5]]
        finally:
            problems += run.stop()
    return cells


def cpu_by_role(pid: int, ours: bool) -> dict[str, float]:
    """CPU seconds (user + system) of a server's process tree by role: on
    two cores every HTTP-side cycle is taken from the decode threads, so
    this is where a server's non-decode cost shows."""
    import psutil

    from frontends.testing import procs

    out: dict[str, float] = {}
    by_role = procs.roles(pid) if ours else {"server": procs.tree(pid)}
    for role, ps in by_role.items():
        for p in ps:
            try:
                t = p.cpu_times()
            except psutil.Error:
                continue
            out[role] = out.get(role, 0.0) + t.user + t.system
    return out


def _interrupt(signum: int, _frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def bench_setup():
    """What a bench that starts servers does first; returns the tqdm class.
    SIGTERM, and SIGINT even where a background shell set it to "ignore",
    unwind through the finally blocks that stop every server started."""
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    from tqdm import tqdm

    tqdm.monitor_interval = 0  # no monitor thread: servers are forked from this process
    return tqdm


def save_fig(fig, path: str) -> None:
    """Lay out, write and close a matplotlib figure (the benches' PNGs)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def pair_setup(args: argparse.Namespace) -> tuple:
    """bench_setup for the benches that run ringserve beside llama-server:
    (tqdm class, model path, the servers of --servers among those two)."""
    tqdm = bench_setup()
    model = args.model or default_model()
    return tqdm, model, [s for s in pick_servers(args) if s.name in ("ringserve", "llama-server")]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tqdm = bench_setup()
    model = args.model or default_model()
    servers = pick_servers(args)
    if not servers:
        sys.exit("no server to run")
    concs = [int(x) for x in args.concurrency.split(",") if x.strip()]
    modes = ["greedy", "sampled"] if args.sampling == "both" else [args.sampling]
    bias = eog_bias(model) if any(s.api == "openai" for s in servers) else {}

    def n_prompts(c: int) -> int:
        return args.num_prompts or (max(c, 2) if args.quick else max(2 * c, 4))

    def applies(s, c: int) -> bool:
        return not (isinstance(s, LlamaCppPython) and c > args.lcp_max_concurrency)

    total = sum(n_prompts(c) * len(modes) * args.rounds for c in concs for s in servers if applies(s, c))
    cells: list[dict] = []
    problems: list[str] = []
    commands: dict[str, list[str]] = {}
    bar = tqdm(total=total, unit="req", file=sys.stderr, mininterval=0.5, dynamic_ncols=True)
    try:
        loads = [(c, loadgen.make_prompts(n_prompts(c))) for c in concs]
        for group in [loads] if args.one_start else [[ld] for ld in loads]:
            c = max(c for c, _ in group)
            st = Settings(model=model, slots=c, ctx=args.ctx_size or 512 * c, threads=args.threads,
                          flash_attn=args.flash_attn, swa_full=args.swa_full)
            for rnd in range(args.rounds):
                for srv in servers:
                    mine = [ld for ld in group if applies(srv, ld[0])]
                    if not mine:
                        continue
                    bar.set_description(f"c={c} r{rnd + 1} {srv.name}: starting")
                    try:
                        cells += one_server(srv, st, mine, rnd, modes, args, bias, bar, problems, commands)
                    except RuntimeError as e:  # a server that cannot start or serve: say so, go on
                        problems.append(f"{srv.name} c={c} r{rnd + 1}: {e}")
                        bar.write(problems[-1], file=sys.stderr)
    except KeyboardInterrupt as e:  # servers are stopped by now; report what was measured
        problems.append(f"interrupted by {e or 'SIGINT'}")
    finally:
        bar.close()
    summary = summary_rows(cells, [s.name for s in servers], modes, concs)
    ph = phase_rows(cells, modes, concs)
    out = sys.stderr if args.json else sys.stdout
    print_tables(summary, ph, out, args)
    for pr in problems:
        print(f"problem: {pr}", file=out)
    if args.plot:
        plot(summary, args.plot)
        print(f"plot: {args.plot}", file=out)
    ok = not problems and all(cl["completed"] == cl["requests"] for cl in cells)
    if args.json:
        for cl in cells:
            cl.pop("_raw", None)
        settings = {k: v for k, v in vars(args).items() if k not in ("json", "plot")}
        settings["request_rate"] = None if math.isinf(args.request_rate) else args.request_rate
        doc = {"ok": ok, "model": model, "settings": settings, "servers": [s.name for s in servers],
               "commands": commands, "summary": summary, "phases": ph, "cells": cells, "problems": problems}
        json.dump(_clean(doc), sys.stdout, indent=1, allow_nan=False)
        print()
    return 0 if ok else 1


def _clean(x):
    """Strict JSON: NaN -> null, numpy scalars -> Python, tuples -> lists."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (np.floating, np.integer)):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


if __name__ == "__main__":
    sys.exit(main())
