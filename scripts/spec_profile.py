#!/usr/bin/env python
"""Engine-level profile of speculative decoding: bench_spec's cells without HTTP.

One engine per configuration (``-np`` as bench_spec's, 32 slots), the same
copy / plain prompts as scripts/bench_spec.py, n concurrent streams read by
threads through WorkerPort leases; rounds A B A B over ``--spec`` values
("off" = none). Per cell: tok/s (TTFT included, as bench_spec), decode tok/s,
steps, llama_decode ms per step, host ms per step, drafted / accepted tokens
and drafts per step (engine counters). What the step loop does with drafts
in flight, without the HTTP layers' noise.

  python scripts/spec_profile.py --cells plain/4,plain/32 --spec off,ngram-map-k
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import loadgen  # noqa: E402
from bench_engine import _read_all  # noqa: E402
from bench_spec import copy_prompts, gen_for, n_requests  # noqa: E402
from engine.config import Config  # noqa: E402
from engine.process import EngineProcess  # noqa: E402
from engine.tracer import PHASES  # noqa: E402
from ipc.client import WorkerPort  # noqa: E402
from ipc.layout import CNT  # noqa: E402


def run_cell(eng, port, vocab, work: str, streams: int, gen: int) -> dict:
    n = n_requests(streams)
    texts = copy_prompts(n) if work == "copy" else loadgen.make_prompts(n)
    prompts = [vocab.tokenize(t.encode(), add_bos=True, special=True) for t in texts]
    p = eng.cfg.sampling(n_predict=gen, temperature=0.0, ignore_eos=1, cache_prompt=0)
    c0 = eng.arena.counters.copy()
    sem = threading.Semaphore(streams)
    got: list[tuple[float, float, int]] = []  # (ttft, latency, tokens)

    def one(ids):
        with sem:
            t0 = time.perf_counter()
            arrivals: list[float] = []
            _read_all(port, ids, p, arrivals)
            got.append((arrivals[0] - t0, time.perf_counter() - t0, len(arrivals)))

    ths = [threading.Thread(target=one, args=(ids,)) for ids in prompts]
    t0 = time.perf_counter()
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    wall = time.perf_counter() - t0
    d = eng.arena.counters.copy() - c0
    steps = max(int(d[CNT["steps_total"]]), 1)
    ph = {x: 1e3 * d[CNT[f"t_{x}_s"]] / steps for x in PHASES}
    dec = sum(k - 1 for _, _, k in got) * streams / sum(lat - tt for tt, lat, _ in got)
    dn, da = int(d[CNT["spec_decode_num_draft_tokens_total"]]), int(d[CNT["spec_decode_num_accepted_tokens_total"]])
    return {"tok_s": sum(k for *_, k in got) / wall, "dec_tok_s": dec, "steps": steps,
            "decode_ms": ph["decode"], "host_ms": sum(v for k, v in ph.items() if k not in ("decode", "idle")),
            "drafted": dn, "accepted": da, "drafts": int(d[CNT["spec_decode_num_drafts_total"]]),
            "ttft_ms": 1e3 * float(np.median([tt for tt, _, _ in got]))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", default="copy/1,copy/4,plain/4,plain/32")
    ap.add_argument("--spec", default="off,ngram-map-k",
                    help="values to compare, comma-separated; separate them with ';' to chain types in one value")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--slots", type=int, default=32)
    ap.add_argument("--gen", type=int, default=96)
    ap.add_argument("--gen-copy", type=int, default=256)
    ap.add_argument("--gen-wide", type=int, default=48)
    a = ap.parse_args(argv)
    from llama_cpp import Llama

    vocab = Llama(Config().model_path(), vocab_only=True, verbose=False)
    cells = [(w, int(c)) for w, c in (x.split("/") for x in a.cells.split(","))]
    specs = a.spec.split(";") if ";" in a.spec else a.spec.split(",")  # ";" lets a value chain types
    res: dict = {}
    for rnd in range(a.rounds):
        for spec in specs if rnd % 2 == 0 else specs[::-1]:
            cfg = Config(parallel=a.slots, ctx_size=a.slots * 1024, threads=2, workers=1,
                         spec_type="none" if spec == "off" else spec, stall_timeout=300)
            with EngineProcess(cfg) as eng:
                port = WorkerPort(eng.arena, 0)
                run_cell(eng, port, vocab, "plain", 1, 4)  # warm-up
                for w, c in cells:
                    r = run_cell(eng, port, vocab, w, c, gen_for(a, w, c))
                    res.setdefault((spec, w, c), []).append(r)
                    print(f"round {rnd + 1} {spec} {w}/{c}: " + " ".join(
                        f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()), flush=True)
    vocab.close()
    print("\n| spec | cell | tok/s | dec tok/s | TTFT ms | steps | decode ms/step | host ms/step | drafted | accepted |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (spec, w, c), rs in res.items():
        m = {k: float(np.median([r[k] for r in rs])) for k in rs[0]}
        print(f"| {spec} | {w}/{c} | {m['tok_s']:.1f} | {m['dec_tok_s']:.1f} | {m['ttft_ms']:.0f} | {m['steps']:.0f} | "
              f"{m['decode_ms']:.1f} | {m['host_ms']:.2f} | {m['drafted']:.0f} | {m['accepted']:.0f} |")
    print("\n| cell | " + " | ".join(f"{s} / {specs[0]}" for s in specs[1:]) + " |")
    for w, c in cells:
        base = float(np.median([r["tok_s"] for r in res[(specs[0], w, c)]]))
        print(f"| {w}/{c} | " + " | ".join(f"{np.median([r['tok_s'] for r in res[(s, w, c)]]) / base:.2f}x"
                                           for s in specs[1:]) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
