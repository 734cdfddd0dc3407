#!/usr/bin/env python
"""Engine throughput through the channels (no HTTP), against its ceiling.

For each concurrency n: an engine with n slots serves n requests submitted
at once (prompt ~--prompt-len tokens, --gen generated, ignore_eos), read by n
threads through WorkerPort leases. Reported side by side, in one run:

* engine: steady-state aggregate decode tokens/s, i.e. tokens that arrived
  while all n streams were generating, over that window;
* ceiling: llama-batched-bench-equivalent pure decode of the same shape with
  our Model and no sampling (scripts/ceiling.py);
* sequential: llama-cpp-python's Llama serving the requests one after another.

The phase table (ms per step and share of the step) comes from the engine's
tracer counters in the arena. --sampling greedy|sampled|both.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time

import numpy as np

from engine.config import Config
from engine.process import EngineProcess
from engine.tracer import PHASES
from ipc.client import WorkerPort
from ipc.layout import CNT

SAMPLED = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
GREEDY = {"temperature": 0.0, "top_k": 40}


def prompt_ids(model: str, n: int, k: int) -> list[list[int]]:
    """n distinct prompts of k tokens (distinct so no prefix is shared)."""
    from llama_cpp import Llama

    v = Llama(model, vocab_only=True, verbose=False)
    base = v.tokenize(("Write a long story about a lighthouse keeper and the sea. " * 40).encode(), add_bos=True)
    v.close()
    return [[base[0]] + [base[1 + (i * 7 + j) % (len(base) - 1)] for j in range(k - 1)] for i in range(n)]


def med(xs: list[float]) -> float:
    return float(np.median(xs))


def run_engine(cfg: Config, n: int, prompts, gen: int, sampling: dict, seed: int) -> dict:
    """One round: n requests at once on a fresh engine (a warm-up request
    first: the first decode allocates compute buffers)."""
    return run_engine_waves(cfg, n, prompts, gen, [sampling], seed)[0]


def run_engine_waves(cfg: Config, n: int, prompts, gen: int, samplings: list[dict], seed: int) -> list[dict]:
    """One wave of n requests per sampling setting, one after another, on one
    fresh engine (--one-engine; warmed once); each wave's figures from its own
    counters' difference."""
    out = []
    with EngineProcess(cfg, n_workers=2) as eng:
        port = WorkerPort(eng.arena, 0)
        _read_all(port, prompts[0][:8], cfg.sampling(**samplings[0], n_predict=4, ignore_eos=1, cache_prompt=0))
        for sampling in samplings:
            c0 = eng.arena.counters.copy()
            arrivals: list[list[float]] = [[] for _ in range(n)]
            p = cfg.sampling(**sampling, n_predict=gen, ignore_eos=1, cache_prompt=0, seed=seed)
            t0, t1 = wave(port, prompts[:n], p, arrivals)
            out.append(_figures(arrivals, t0, t1, eng.arena.counters.copy() - c0))
    return out


def wave(port: WorkerPort, prompts, p: dict, arrivals: list | None = None) -> tuple[float, float]:
    """One request per prompt at once, each read by its own thread; (start, end)."""
    ths = [threading.Thread(target=_read_all, args=(port, pr, p, None if arrivals is None else arrivals[i]))
           for i, pr in enumerate(prompts)]
    t0 = time.perf_counter()
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    return t0, time.perf_counter()


def _figures(arrivals: list[list[float]], t0: float, t1: float, d: np.ndarray) -> dict:
    firsts = [a[0] for a in arrivals]
    ends = [a[-1] for a in arrivals]
    lo, hi = max(firsts), min(ends)
    inwin = sum(sum(1 for x in a if lo < x <= hi) for a in arrivals)
    steps = max(d[CNT["steps_total"]], 1)
    phases = {ph: 1e3 * d[CNT[f"t_{ph}_s"]] / steps for ph in PHASES}
    busy = sum(v for k, v in phases.items() if k != "idle")
    host = busy - phases["decode"]
    return {
        "tokens_per_s": inwin / (hi - lo) if hi > lo else 0.0,
        "e2e_tokens_per_s": sum(len(a) for a in arrivals) / (t1 - t0),
        "ttft_p50_ms": 1e3 * (float(np.median(firsts)) - t0),
        "host_share": host / busy if busy else 0.0,
        "phases_ms_per_step": {k: round(v, 4) for k, v in phases.items()},
        "steps": int(steps),
    }


def _read_all(port: WorkerPort, prompt, params: dict, arrivals: list | None = None) -> None:
    with port.lease() as lease:
        lease.submit(prompt, params)
        while True:
            tok = lease.read(1.0)
            if tok is None:
                if not lease.engine_ok():
                    raise RuntimeError("engine died")
                continue
            if tok.token >= 0 and arrivals is not None:
                arrivals.append(time.perf_counter())
            if tok.last:
                return


def run_sequential(model: str, prompts, gen: int, sampling: dict, ctx: int, fa: bool) -> float:
    """llama-cpp-python's Llama, one request after another: tokens/s."""
    return run_sequentials(model, prompts, gen, [sampling], ctx, fa)[0]


def run_sequentials(model: str, prompts, gen: int, samplings: list[dict], ctx: int, fa: bool) -> list[float]:
    """run_sequential for each sampling setting on one Llama (loaded once): tokens/s each."""
    from llama_cpp import Llama

    llm = Llama(model, n_ctx=ctx, n_threads=2, n_threads_batch=2, flash_attn=fa, verbose=False)
    out = []
    for sampling in samplings:
        total, t0 = 0, time.perf_counter()
        for pr in prompts:
            res = llm.create_completion(pr, max_tokens=gen, temperature=sampling["temperature"],
                                        top_k=sampling["top_k"], top_p=sampling.get("top_p", 1.0),
                                        min_p=sampling.get("min_p", 0.0), seed=1234)
            total += res["usage"]["completion_tokens"]
        out.append(total / (time.perf_counter() - t0))
    llm.close()
    return out


def main() -> int:
    # SIGTERM unwinds like Ctrl-C, so every engine and arena is cleaned up
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--sampling", choices=("greedy", "sampled", "both"), default="both")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--fa", default="auto", choices=("on", "off", "auto"))
    ap.add_argument("--seq-requests", type=int, default=3, help="requests for the sequential baseline")
    ap.add_argument("--reps", type=int, default=3, help="rounds per cell (medians are reported)")
    ap.add_argument("--backend-sampling", action="store_true", help="the engine samples on the device (-bs)")
    ap.add_argument("--one-engine", action="store_true",
                    help="per round, one engine start (and one Llama) for every sampling kind, in turn")
    ap.add_argument("--quick", action="store_true", help="small shapes, --one-engine; asserts completion only")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--plot", default="")
    a = ap.parse_args()
    if a.quick:
        a.concurrency, a.prompt_len, a.gen, a.seq_requests, a.reps, a.one_engine = "2", 16, 12, 1, 1, True
    conc = [int(x) for x in a.concurrency.split(",")]
    kinds = ["greedy", "sampled"] if a.sampling == "both" else [a.sampling]
    model = Config().model_path()
    from ceiling import run as ceiling  # scripts/ceiling.py

    rows = []
    for n in conc:
        prompts = prompt_ids(model, n, a.prompt_len)
        per = -(-(a.prompt_len + a.gen + 16) // 256) * 256  # as scripts/ceiling.py sizes it
        cfg = Config(model=model, parallel=n, ctx_size=n * per, threads=2, flash_attn=a.fa, http_threads=max(n, 4),
                     workers=1, batch_size=max(2048, n), ubatch_size=512, backend_sampling=a.backend_sampling)
        # A B C rounds: ceiling, engine and sequential measured one after the
        # other in every round, ratios taken within the round, medians over
        # rounds (this VM's speed drifts by 10% within minutes).
        ceils: list[float] = []
        runs: dict[str, list[tuple[dict, float]]] = {k: [] for k in kinds}
        for rep in range(a.reps):
            cres = ceiling(n, a.prompt_len, a.gen, a.fa, 2, cfg.batch_size, cfg.ubatch_size, reps=1, model=model)
            ceils.append(cres["tg_tps_median"])
            samps = [GREEDY if kind == "greedy" else SAMPLED for kind in kinds]
            if a.one_engine:  # every kind's wave on one engine start, every kind's baseline on one Llama
                rs = run_engine_waves(cfg, n, prompts, a.gen, samps, seed=1234 + rep)
                seqs = run_sequentials(model, prompts[: a.seq_requests], a.gen, samps, per, cres["fa_on"])
                for kind, r, seq in zip(kinds, rs, seqs):
                    runs[kind].append((r, seq))
            for kind, samp in zip(kinds, samps) if not a.one_engine else ():
                r = run_engine(cfg, n, prompts, a.gen, samp, seed=1234 + rep)
                # Llama takes flash attention as a bool: give it what "auto" resolved to
                seq = run_sequential(model, prompts[: a.seq_requests], a.gen, samp, per, cres["fa_on"])
                runs[kind].append((r, seq))
        ceil = med(ceils)
        rows.append({"impl": "ceiling", "sampling": "none", "concurrency": n, "tokens_per_s": ceil,
                     "tokens_per_s_rounds": ceils})
        for kind in kinds:
            rs = runs[kind]
            r = sorted((x[0] for x in rs), key=lambda x: x["tokens_per_s"])[len(rs) // 2]  # the median round
            r["tokens_per_s_rounds"] = [round(x[0]["tokens_per_s"], 1) for x in rs]
            seq = med([x[1] for x in rs])
            rc = med([x[0]["tokens_per_s"] / c for x, c in zip(rs, ceils)])
            rq = med([x[0]["tokens_per_s"] / x[1] for x in rs])
            rows.append({"impl": "engine", "sampling": kind, "concurrency": n, **r,
                         "ratio_ceiling": rc, "ratio_sequential": rq})
            rows.append({"impl": "sequential", "sampling": kind, "concurrency": n, "tokens_per_s": seq,
                         "tokens_per_s_rounds": [round(x[1], 1) for x in rs]})
            if not a.json:
                print(f"n={n:3d} {kind:8s} engine {r['tokens_per_s']:7.1f} t/s  ceiling {ceil:7.1f}  "
                      f"x{rc:.3f}  sequential {seq:6.1f} x{rq:.2f}  host {100 * r['host_share']:.2f}%  "
                      f"rounds engine {r['tokens_per_s_rounds']} ceiling {[round(c, 1) for c in ceils]}", flush=True)
    if a.json:
        print(json.dumps({"rows": rows}))
    else:
        print_tables(rows)
    if a.plot:
        plot(rows, a.plot)
    if a.quick:
        assert all(r["tokens_per_s"] > 0 for r in rows), rows
    return 0


def print_tables(rows: list[dict]) -> None:
    print("\n(t/s: medians over rounds; ratios: medians of the ratios within each round)")
    print("| n | sampling | engine t/s | ceiling t/s | / ceiling | sequential t/s | / sequential | host share |")
    print("|---|---|---|---|---|---|---|---|")
    ceil = {r["concurrency"]: r["tokens_per_s"] for r in rows if r["impl"] == "ceiling"}
    seq = {(r["concurrency"], r["sampling"]): r["tokens_per_s"] for r in rows if r["impl"] == "sequential"}
    for r in (r for r in rows if r["impl"] == "engine"):
        n, k = r["concurrency"], r["sampling"]
        print(f"| {n} | {k} | {r['tokens_per_s']:.1f} | {ceil[n]:.1f} | {r['ratio_ceiling']:.3f} | "
              f"{seq[(n, k)]:.1f} | {r['ratio_sequential']:.2f} | {100 * r['host_share']:.2f}% |")
    print("\nphases, ms per step (the seed's table):")
    print("| n | sampling | steps | " + " | ".join(PHASES) + " | host share |")
    print("|---|---|---|" + "---|" * len(PHASES) + "---|")
    for r in (r for r in rows if r["impl"] == "engine"):
        ph = r["phases_ms_per_step"]
        print(f"| {r['concurrency']} | {r['sampling']} | {r['steps']} | " +
              " | ".join(f"{ph[p]:.3f}" for p in PHASES) + f" | {100 * r['host_share']:.2f}% |")


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for impl, kind, style in (("ceiling", "none", "k--"), ("engine", "greedy", "o-"), ("engine", "sampled", "s-"),
                              ("sequential", "greedy", "x:"), ("sequential", "sampled", "+:")):
        pts = [(r["concurrency"], r["tokens_per_s"]) for r in rows if r["impl"] == impl and r["sampling"] == kind]
        if pts:
            ax.plot(*zip(*pts), style, label=f"{impl} {kind}" if kind != "none" else impl)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("decode tokens/s")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
