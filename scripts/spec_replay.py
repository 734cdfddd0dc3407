#!/usr/bin/env python
"""Speculation replayed offline: the engine's drafters and step choice over recorded greedy outputs.

Why: whether a drafter or a choice rule pays on the copy workload is a
question of which tokens it drafts and what the steps cost, and both can be
replayed without the model: greedy output does not depend on the drafts
(tests/test_spec.py), so one recorded output per prompt and one measured
step-cost curve (scripts/step_cost.py --steps) give every step of a
speculative run. The replay uses the engine's own classes (engine/spec:
`Speculator` itself, with its drafters, rates and step choice, over a stand-in
for the model's batch), a lone slot per request (the copy/1 cell). It
predicts; bench_spec.py measures.

    python scripts/spec_replay.py --record /tmp/copy.json -n 6      # greedy outputs, spec off (the model)
    python scripts/spec_replay.py --replay /tmp/copy.json --types "ngram-map-k;ngram-map-k,ngram-short"

Per chain of types: decode steps, steps that verified nothing, drafted and
accepted tokens, the replayed decode time and its speedup over one token a
step (TTFT not included), and of the steps without a draft those where
the history did predict the next tokens (and those steps' predicted
continuations summed, overlapping: what the chain left undrafted there);
and the oracle row: the bound of any drafter that copies from the history
(`oracle`).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from engine.config import Config  # noqa: E402
from engine.spec import Speculator  # noqa: E402
from engine.spec.cost import StepCost  # noqa: E402
from ipc.layout import CNT  # noqa: E402

# prompt-free one-slot steps of 1 + k rows, ms (step_cost.py --steps 1xR, AVX-512 EPYC, -t 2, 2026-12-05)
CURVE = {1: 11.8, 2: 22.4, 3: 27.4, 4: 29.5, 5: 47.3, 6: 49.3, 7: 56.4, 8: 43.1, 9: 64.3, 12: 55.5, 13: 78.7,
         16: 67.0, 17: 93.4, 20: 79.8, 24: 91.2, 25: 122.8, 28: 102.6, 32: 114.5, 33: 149.9, 40: 143.3,
         48: 165.6, 49: 207.0, 64: 210.6}


def measured(curve: dict[int, float], cost: StepCost) -> StepCost:
    """``cost`` fed one one-ubatch step per row count of ``curve`` (ms)."""
    for r, ms in curve.items():
        cost.observe([r], ms / 1e3)
    return cost


def record(path: str, n: int, gen: int) -> None:
    """Greedy outputs of n copy prompts (bench_spec's), spec off, through the engine."""
    from bench_spec import copy_prompts
    from engine.direct import generate
    from engine.process import EngineProcess
    from ipc.client import WorkerPort
    from llama_cpp import Llama

    vocab = Llama(Config().model_path(), vocab_only=True, verbose=False)
    prompts = [vocab.tokenize(t.encode(), add_bos=True, special=True) for t in copy_prompts(n)]
    cfg = Config(parallel=4, ctx_size=4096, threads=2, workers=1, spec_type="none")
    out = []
    with EngineProcess(cfg) as eng:
        port = WorkerPort(eng.arena, 0)
        p = cfg.sampling(n_predict=gen, temperature=0.0, ignore_eos=1, cache_prompt=0)
        for ids in prompts:
            toks = generate(port, ids, p).tokens
            out.append({"prompt": list(map(int, ids)), "output": toks})
    vocab.close()
    with open(path, "w") as f:
        json.dump(out, f)
    print(f"recorded {len(out)} outputs of {gen} tokens to {path}")


class _Batch:
    """What Speculator.draft reads of the model's batch."""

    def __init__(self) -> None:
        self.max_out, self.n_out = 1 << 20, 0


class _Model:
    """The engine model's surface Speculator uses: add() places a token, nothing is computed."""

    n_ubatch = 512
    model = None

    def __init__(self) -> None:
        self.batch = _Batch()

    def add(self, tok: int, pos: int, seq: int, logits: bool) -> int:
        self.batch.n_out += 1
        return self.batch.n_out - 1


class _Slot:
    """A lone generating slot, as engine/slots.py's for the fields Speculator reads."""

    def __init__(self, prompt: np.ndarray, n_predict: int) -> None:
        self.id, self.n_ctx, self.n_predict = 0, 1 << 16, n_predict
        self.cache = np.zeros(len(prompt) + n_predict + 128, np.int32)
        self.cache[:len(prompt)] = prompt
        self.n_past, self.n_decoded, self.last = len(prompt), 0, -1
        self.req = type("Req", (), {"prompt": prompt})()


def replay(recs: list[dict], chain: str, curve: dict[int, float]) -> dict:
    """The engine's Speculator (engine/spec) over one lone slot per request, requests one after another
    (its cost curve and pooled rate carry over, as in the engine); each step is the batch.py build and
    loop.py verification of a real step, its time the curve's price of the step's one ubatch."""
    cfg = Config(spec_type=chain)
    sp = Speculator(cfg, _Model(), np.zeros(len(CNT), np.float64))
    measured(curve, sp.cost)  # the ladder still runs (a young engine's first rates come from it)
    sampler = type("Sampler", (), {"kind": "host"})()
    params = cfg.sampling()
    steps = bare = drafted = accepted = missed = missed_tokens = 0
    t = t_off = 0.0
    for rec in recs:
        prompt, out = np.array(rec["prompt"], np.int32), np.array(rec["output"], np.int32)
        hist = np.concatenate([prompt, out])
        s = _Slot(prompt, len(out))
        sp.begin(s, sampler, params)
        s.last, s.n_decoded, i = int(out[0]), 1, 0  # the prompt's step sampled out[0]
        while i < len(out) - 1:
            s.cache[s.n_past] = s.last  # engine/batch.py build
            s.n_past += 1
            sp.m.batch.n_out = 1
            k = sp.draft([s], 1, 1 << 20, lambda _: 1 << 20)
            d = sp.state[0].draft
            want = out[i + 1:i + 1 + k]
            eq = d[:len(want)] == want
            a = len(want) if eq.all() else int(np.argmin(eq))
            if k:
                s.n_past -= k - a  # engine/spec/verify.py cut: the rejected tail leaves
                sp.verified(s, a)
            dt = sp.cost.price([0], [1 + k])
            sp.observe(0, dt)
            steps, bare, drafted, accepted = steps + 1, bare + (k == 0), drafted + k, accepted + a
            if k == 0:  # where the chain loses to the oracle: the history predicted what it did not draft
                best = _longest(hist, len(prompt) + i, out, i)
                missed, missed_tokens = missed + (best > 0), missed_tokens + best
            t += dt
            t_off += sp.cost.price([0], [1]) * (a + 1)
            i += a + 1
            s.n_decoded += a + 1
            s.last = int(out[i])
        sp.end(s)
    return {"steps": steps, "bare": bare, "drafted": drafted, "accepted": accepted, "missed": missed,
            "missed_tokens": missed_tokens, "ms": 1e3 * t, "speedup": t_off / t if t else 0.0}


def _longest(hist: np.ndarray, cur: int, out: np.ndarray, i: int, most: int = 63) -> int:
    """The longest continuation of ``out[i]`` (at ``hist[cur]``) that an earlier occurrence of it in the
    history predicts, known in hindsight (the oracle's draft, before its length is priced)."""
    best = 0
    for q in np.flatnonzero(hist[:cur] == out[i]):
        a = 0
        while a < most and q + 1 + a < cur and i + 1 + a < len(out) and hist[q + 1 + a] == out[i + 1 + a]:
            a += 1
        best = max(best, a)
    return best


def oracle(recs: list[dict], curve: dict[int, float]) -> dict:
    """The bound of any drafter that copies from the request's history: each step drafts the longest
    continuation that any earlier occurrence of the sampled token has (known in hindsight), cut to the
    length that costs least per token on the curve; its bare steps are tokens no history position predicts."""
    c = measured(curve, StepCost(128)).curve()
    steps = bare = accepted = 0
    t = t_off = 0.0
    for rec in recs:
        prompt, out = np.array(rec["prompt"], np.int32), np.array(rec["output"], np.int32)
        hist, n_p, i = np.concatenate([prompt, out]), len(prompt), 0
        while i < len(out) - 1:
            best = _longest(hist, n_p + i, out, i)
            k = min(range(best + 1), key=lambda x: c[1 + x] / (x + 1))
            steps, bare, accepted = steps + 1, bare + (best == 0), accepted + k
            t += float(c[1 + k])
            t_off += float(c[1]) * (k + 1)
            i += k + 1
    return {"steps": steps, "bare": bare, "drafted": accepted, "accepted": accepted, "missed": 0,
            "missed_tokens": 0, "ms": 1e3 * t, "speedup": t_off / t if t else 0.0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--record", metavar="FILE")
    ap.add_argument("-n", type=int, default=6, help="copy prompts to record")
    ap.add_argument("--gen", type=int, default=256)
    ap.add_argument("--replay", metavar="FILE")
    ap.add_argument("--types", default="ngram-map-k;ngram-map-k,ngram-short;ngram-mod",
                    help="chains to replay, ';'-separated (a chain is comma-separated, as --spec-type)")
    ap.add_argument("--curve", metavar="JSON", help="{rows: ms} of one-slot steps (default: CURVE)")
    a = ap.parse_args(argv)
    if a.record:
        record(a.record, a.n, a.gen)
    if a.replay:
        with open(a.replay) as f:
            recs = json.load(f)
        curve = {int(k): v for k, v in json.loads(a.curve).items()} if a.curve else CURVE
        print("| types | steps | steps without a draft | of them predicted (tokens) | drafted | accepted | "
              "decode ms | speedup over 1 a step |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for chain in [*a.types.split(";"), "oracle"]:
            r = oracle(recs, curve) if chain == "oracle" else replay(recs, chain, curve)
            print(f"| {chain} | {r['steps']} | {r['bare']} | {r['missed']} ({r['missed_tokens']}) | {r['drafted']} | "
                  f"{r['accepted']} | {r['ms']:.0f} | {r['speedup']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
