#!/usr/bin/env python
"""Abandoned streams against the host-RAM tier: does a dropped unique
request grow the server toward its --cache-ram bound (issue 24)?

soak.py's churn (8 streaming /completion requests at a time, each a unique
prompt, dropped with an RST after 0.5-1.5 s) against ringserve and
llama-server at the same --cache-ram (default 8192 MiB, both servers'
default), alternating per round (A B A B), in one run. Reported per server:
the summed PSS of the process tree after start, then every --every
requests, the growth per dropped request (least-squares slope over all
samples), and ringserve's RAM tier (/metrics cache_ram_bytes, entries).

  python scripts/bench_drop.py                 # 2 rounds x 400 requests (~6 min)
  python scripts/bench_drop.py --quick
  python scripts/bench_drop.py --complete 24 --cache-ram 64 --servers ringserve   # short unique prompts
  python scripts/bench_drop.py --kept 300 --complete 8 --cache-ram 64 --servers ringserve   # the tier at its bound

--kept W: each prompt opens with a unique document of W words and every
request is answered whole (dropped only after 60 s), so the tier keeps
each one's KV (a blob that saves many tokens for its bytes) and must hold
its bound by evicting the least recently used; the short prompts of the
plain churn put nothing in RAM (an abandoned stream keeps only its prompt
in its slot; an answered 36-token one is held elsewhere or too small).
"""
from __future__ import annotations

import argparse
import json
import sys

from _treemem import tree_mem
from bench_mixed import f, med
from bench_servers import Running, Settings
from bench_serving import _clean, bench_setup, default_model, pick_servers
from frontends.testing.http import metrics
from soak import Churn, fit


def one(srv, st: Settings, n: int, every: int, seed: int, complete: int = 0, kept: int = 0) -> dict:
    with Running(srv, st) as run:
        try:
            samples = []

            def sample(done: int) -> None:
                pss, _ = tree_mem(run.proc.pid)
                m = metrics(run.base) if srv.name == "ringserve" else {}
                samples.append((done, pss, m.get("ringserve:cache_ram_bytes", 0.0) / 2**20,
                                m.get("ringserve:cache_ram_entries", 0.0)))

            churn = Churn(run.port, 8, seed)
            if complete:
                churn.n_predict = complete
            if kept:
                churn.doc_words, churn.keep = kept, (60.0, 60.0)
            churn.on_done = lambda: (churn.done % every == 0) and sample(churn.done)
            sample(0)
            churn.run(n)
            sample(churn.done)
        finally:
            run.stop()
    xs, ys = [s[0] for s in samples[1:]], [s[1] for s in samples[1:]]
    slope, _ = fit(xs, ys) if len(xs) > 2 else (float("nan"), 0.0)
    half = [s for s in samples if s[0] >= n // 2]
    s2, _ = fit([s[0] for s in half], [s[1] for s in half]) if len(half) > 2 else (float("nan"), 0.0)
    return {"server": srv.name, "samples": samples, "kb_per_req": slope * 1024, "kb_per_req_2nd": s2 * 1024,
            "pss_start": samples[0][1], "pss_end": samples[-1][1], "answered": churn.stats["answered"],
            "ram_mib_end": samples[-1][2], "ram_entries_end": samples[-1][3]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=400, help="dropped requests per run")
    p.add_argument("--every", type=int, default=25)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--cache-ram", type=int, default=8192)
    p.add_argument("--servers", default="ringserve,llama-server")
    p.add_argument("--ringserve-args", default="")
    p.add_argument("--llama-server-args", default="")
    p.add_argument("--llama-server", default="")
    p.add_argument("--model", default="")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--complete", type=int, default=0, metavar="N",
                   help="requests of N tokens the server ends before the drop (answered whole): the tier fills "
                        "to --cache-ram and stays there")
    p.add_argument("--kept", type=int, default=0, metavar="W",
                   help="each prompt opens with a unique W-word document, answered whole: the tier fills (doc)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--quick", action="store_true")
    a = p.parse_args(argv)
    if a.quick:  # samples at 0, 6, 12, 18, 24 and the end: a slope over 5 points
        a.n, a.every, a.rounds = 24, 6, 1
    bench_setup()
    a.ringserve_args += f" --cache-ram {a.cache_ram}"
    a.llama_server_args += f" --cache-ram {a.cache_ram}"
    servers = [s for s in pick_servers(a) if s.name in ("ringserve", "llama-server")]
    st = Settings(model=a.model or default_model(), slots=8, ctx=8 * 4096, threads=2, flash_attn="auto")
    runs = []
    for rnd in range(a.rounds):
        for srv in servers:
            r = one(srv, st, a.n, a.every, 1234 + rnd, a.complete, a.kept)
            r["round"] = rnd
            runs.append(r)
            print(f"{srv.name} r{rnd + 1}: {f(r['kb_per_req'], '.1f')} kB/request", file=sys.stderr)
    out = sys.stderr if a.json else sys.stdout
    what = f"answered whole ({a.complete} tokens)" if a.complete else "each dropped after 0.5-1.5 s"
    if a.kept:
        what = f"each opening with a unique {a.kept}-word document, {what}"
    print(f"\n{a.n} unique streaming /completion requests per run, 8 at a time, {what}; "
          f"-np 8 -c {8 * 4096} -t 2 --cache-ram {a.cache_ram}; summed PSS of the tree, MiB; slope: "
          f"least squares over the samples every {a.every} requests; {a.rounds} round(s) A B\n", file=out)
    print("| server | PSS at start | PSS at end | growth kB / request (all) | (second half) | RAM tier MiB / entries "
          "at end |", file=out)
    print("|---|---|---|---|---|---|", file=out)
    for name in dict.fromkeys(r["server"] for r in runs):
        rs = [r for r in runs if r["server"] == name]
        g = lambda k: med([r[k] for r in rs])  # noqa: E731
        print(f"| {name} | {f(g('pss_start'))} | {f(g('pss_end'))} | {f(g('kb_per_req'), '.1f')} "
              f"| {f(g('kb_per_req_2nd'), '.1f')} | {f(g('ram_mib_end'), '.1f')} / {f(g('ram_entries_end'))} |",
              file=out)
    for r in runs:  # the trajectory: the tier must reach its bound and stay there, PSS flat
        if r["server"] != "ringserve":
            continue
        print(f"\nringserve r{r['round'] + 1} (bound {a.cache_ram} MiB): requests done, summed PSS MiB, RAM tier MiB "
              f"/ entries; the tier's most: {f(max(x[2] for x in r['samples']), '.1f')} MiB\n", file=out)
        print("| requests | PSS MiB | RAM tier MiB | entries |", file=out)
        print("|---|---|---|---|", file=out)
        for done, pss, mib, ents in r["samples"]:
            print(f"| {done} | {f(pss)} | {f(mib, '.1f')} | {f(ents)} |", file=out)
    if a.json:
        json.dump(_clean({"runs": runs}), sys.stdout, indent=1)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
