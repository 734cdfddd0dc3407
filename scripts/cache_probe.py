#!/usr/bin/env python
"""Determinism probe: does a cache hit give the text a cold request gives?

For each prompt, on one slot (-np 1): A = the request from scratch
(cache_prompt false); then a one-token request with cache_prompt true puts
the prompt in the slot; C = the request again with cache_prompt true, now
reusing all but the last prompt token (timings.cache_n > 0). The prompt's
KV is the same in A and C, but C evaluates the last prompt token in a batch
of one where A evaluated it inside the prompt's batch: llama.cpp's CPU
matmul picks its kernels (repacked Q4_K gemm, llamafile tinyBLAS) by batch
size, so the logits differ in the last bits, and a near tie (greedy) or a
sampled draw (seeded) can go the other way. Reported per server and mode:
how many of the prompts' A and C agree, token for token in text.

Modes: greedy (temperature 0) and seeded (temperature 0.8, seed 42).
Servers: ringserve and llama-server; ``--ringserve-lib DIR`` runs ringserve
on another libllama build (LLAMA_CPP_LIB_PATH, llama-cpp-python's loader),
``--llama-server`` another llama-server binary, so the same probe measures
a build without the batch-size-dependent kernels (GGML_CPU_REPACK=OFF,
GGML_LLAMAFILE=OFF). ``--throughput DIR,...`` runs llama-batched-bench of
each build directory instead: prompt and generation tokens/s.

  python scripts/cache_probe.py                              # 100 prompts, both servers
  python scripts/cache_probe.py --quick --json               # the test suite's
  python scripts/cache_probe.py --throughput A/bin,B/bin     # kernels' cost
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys

import loadgen
from bench_servers import Running, Settings, add_server_args
from bench_serving import MODES, _clean, bench_setup, default_model, pick_servers
from frontends.testing import post

PROBE_MODES = {"greedy": dict(MODES["greedy"]), "seeded": dict(MODES["sampled"], seed=42)}
FIRST = "I believe the meaning of life is"  # the probe


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("-m", "--model", default="", help="GGUF (default: ringserve's default model)")
    a("--servers", default="ringserve,llama-server", help="ringserve and/or llama-server")
    a("--prompts", type=int, default=100)
    a("-n", "--n-predict", type=int, default=16)
    a("--modes", default="greedy,seeded")
    a("-t", "--threads", type=int, default=2)
    a("-fa", "--flash-attn", default="auto", choices=("on", "off", "auto"))
    a("--ringserve-lib", default="", help="a libllama build dir for ringserve (LLAMA_CPP_LIB_PATH)")
    a("--label", default="", help="a name for this build in the table")
    a("--control", action="store_true",
      help="C from scratch too (cache_prompt false, no priming): the run-to-run floor of the comparison")
    a("--throughput", default="", help="comma list of build bin dirs: run llama-batched-bench of each instead")
    a("--bb-args", default="-c 4096 -b 2048 -ub 512 -npp 128 -ntg 32 -npl 1,4,8",
      help="llama-batched-bench flags for --throughput")
    add_server_args(a, timeout=300.0)
    a("--json", action="store_true", help="JSON on stdout (the tables go to stderr)")
    a("--quick", action="store_true", help="4 prompts, 4 tokens: completeness only")
    args = p.parse_args(argv)
    if args.quick:
        args.prompts, args.n_predict = 4, 4
    args.mode_names = [m.strip() for m in args.modes.split(",") if m.strip()]
    return args


def prompts(n: int) -> list[str]:
    return ([FIRST] + loadgen.make_prompts(n - 1))[:n]


def complete(run: Running, prompt: str, n: int, samp: dict, cache: bool, timeout: float) -> dict:
    body = {"prompt": prompt, "n_predict": n, "cache_prompt": cache, "ignore_eos": True, "id_slot": 0, **samp}
    code, out = post(run.url("/completion"), body, timeout)
    if code != 200:
        raise RuntimeError(f"{run.server.name}: HTTP {code}: {str(out)[:300]}")
    return out


def probe(srv, st: Settings, args, bar, commands: dict) -> list[dict]:
    """One server, every mode: per prompt, A (scratch) against C (cache hit)."""
    rows = []
    env_lib = args.ringserve_lib if srv.name == "ringserve" else ""
    old = os.environ.get("LLAMA_CPP_LIB_PATH")
    if env_lib:
        os.environ["LLAMA_CPP_LIB_PATH"] = env_lib
    try:
        run = Running(srv, st)
    finally:
        if env_lib:
            os.environ.pop("LLAMA_CPP_LIB_PATH") if old is None else os.environ.update(LLAMA_CPP_LIB_PATH=old)
    with run:
        try:
            commands[srv.name] = (f"LLAMA_CPP_LIB_PATH={env_lib} " if env_lib else "") + shlex.join(run.cmd)
            bar.write(f"{srv.name}: {commands[srv.name]}", file=sys.stderr)
            for mode in args.mode_names:
                samp = PROBE_MODES[mode]
                agree = hits = 0
                diffs = []
                for i, p in enumerate(prompts(args.prompts)):
                    bar.set_description(f"{srv.name} {mode}")
                    a = complete(run, p, args.n_predict, samp, False, args.timeout)
                    if not args.control:
                        complete(run, p, 1, samp, True, args.timeout)
                    c = complete(run, p, args.n_predict, samp, not args.control, args.timeout)
                    hit = c["timings"]["cache_n"] > 0
                    hits += hit
                    same = a["content"] == c["content"]
                    agree += same
                    if not same and len(diffs) < 3:
                        diffs.append({"prompt": p, "scratch": a["content"], "cached": c["content"],
                                      "cache_n": c["timings"]["cache_n"]})
                    bar.update(1)
                rows.append({"server": srv.name, "build": (args.label or "default") + (" (control)" if args.control else ""),
                             "mode": mode,
                             "prompts": args.prompts, "agree": agree, "hits": hits, "examples": diffs})
        finally:
            run.stop()
    return rows


def print_probe(rows: list[dict], args, out) -> None:
    print(f"\ncache hit vs from scratch: {args.prompts} prompts, {args.n_predict} tokens, -np 1 -t {args.threads} "
          f"-fa {args.flash_attn} --swa-full; A = cache_prompt false, C = "
          + ("the same request from scratch again (control)" if args.control
             else "the same request after the prompt was cached (cache_n > 0)") + "\n", file=out)
    print("| server | build | mode | prompts | A == C | cache hits |", file=out)
    print("|---|---|---|---|---|---|", file=out)
    for r in rows:
        print(f"| {r['server']} | {r['build']} | {r['mode']} | {r['prompts']} | {r['agree']} "
              f"({100 * r['agree'] / r['prompts']:.0f}%) | {r['hits']} |", file=out)


BB_ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|"
                    r"\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|")


def throughput(dirs: list[str], model: str, args, out) -> list[dict]:
    """llama-batched-bench of each build, alternating builds per round
    (2 rounds), medians: prompt (S_PP) and generation (S_TG) tokens/s."""
    res: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for _ in range(2):
        for d in dirs:
            cmd = [os.path.join(d, "llama-batched-bench"), "-m", model, "-t", str(args.threads), "-fa",
                   args.flash_attn, *shlex.split(args.bb_args)]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
            if p.returncode != 0:
                raise RuntimeError(f"{shlex.join(cmd)}: exit {p.returncode}\n{p.stderr[-2000:]}")
            for ln in p.stdout.splitlines():
                m = BB_ROW.match(ln.strip())
                if m:  # PP TG B N_KV T_PP S_PP T_TG S_TG T S
                    res.setdefault((d, int(m[3])), []).append((float(m[6]), float(m[8])))
    rows = []
    base = dirs[0]
    for (d, b), v in sorted(res.items(), key=lambda kv: (kv[0][1], dirs.index(kv[0][0]))):
        pp = sorted(x for x, _ in v)[len(v) // 2]
        tg = sorted(y for _, y in v)[len(v) // 2]
        rows.append({"build": d, "B": b, "pp_tok_s": pp, "tg_tok_s": tg})
    for r in rows:
        b0 = next(x for x in rows if x["build"] == base and x["B"] == r["B"])
        r["pp_ratio"], r["tg_ratio"] = r["pp_tok_s"] / b0["pp_tok_s"], r["tg_tok_s"] / b0["tg_tok_s"]
    print(f"\nllama-batched-bench {args.bb_args} -t {args.threads} -fa {args.flash_attn}; 2 rounds alternating, "
          f"medians; ratio = over {base}\n", file=out)
    print("| build | parallel B | prompt tok/s (S_PP) | ratio | generation tok/s (S_TG) | ratio |", file=out)
    print("|---|---|---|---|---|---|", file=out)
    for r in rows:
        print(f"| {r['build']} | {r['B']} | {r['pp_tok_s']:.1f} | {r['pp_ratio']:.2f} | {r['tg_tok_s']:.1f} "
              f"| {r['tg_ratio']:.2f} |", file=out)
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tqdm = bench_setup()
    model = args.model or default_model()
    out = sys.stderr if args.json else sys.stdout
    if args.throughput:
        rows = throughput([d.strip() for d in args.throughput.split(",") if d.strip()], model, args, out)
        if args.json:
            json.dump(_clean({"ok": True, "throughput": rows}), sys.stdout, indent=1)
            print()
        return 0
    servers = [s for s in pick_servers(args) if s.name in ("ringserve", "llama-server")]
    st = Settings(model=model, slots=1, ctx=4096, threads=args.threads, flash_attn=args.flash_attn)
    rows: list[dict] = []
    problems: list[str] = []
    commands: dict[str, str] = {}
    bar = tqdm(total=len(servers) * len(args.mode_names) * args.prompts, unit="prompt", file=sys.stderr,
               mininterval=0.5, dynamic_ncols=True)
    try:
        for srv in servers:
            try:
                rows += probe(srv, st, args, bar, commands)
            except RuntimeError as e:
                problems.append(f"{srv.name}: {e}")
    except KeyboardInterrupt as e:
        problems.append(f"interrupted by {e or 'SIGINT'}")
    finally:
        bar.close()
    print_probe(rows, args, out)
    for pr in problems:
        print(f"problem: {pr}", file=out)
    ok = not problems and len(rows) == len(servers) * len(args.mode_names)
    if args.json:
        json.dump(_clean({"ok": ok, "model": model, "commands": commands, "rows": rows, "problems": problems}),
                  sys.stdout, indent=1)
        print()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
