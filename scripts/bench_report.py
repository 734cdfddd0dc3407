"""Tables, pair ratios, phase figures and the plot of scripts/bench_serving.py.

Why ratios are taken pair by pair: ringserve's round r and the other
server's round r ran back to back, so their ratio is free of drift slower
than a round; the median over rounds is what the table shows.
"""
from __future__ import annotations

import math
from typing import TextIO

import numpy as np

import loadgen
from engine.tracer import PHASES as ALL_PHASES

PHASES = tuple(p for p in ALL_PHASES if p != "idle")  # the busy phases of a step
BASE = "ringserve"


def phases(m0: dict[str, float], m1: dict[str, float]) -> dict | None:
    """ringserve's engine tracer over one cell, from two /metrics scrapes."""
    if not m0 or not m1:
        return None
    d = lambda k: m1.get(k, 0.0) - m0.get(k, 0.0)  # noqa: E731
    ph = lambda p: d(f'ringserve:engine_phase_seconds_total{{phase="{p}"}}')  # noqa: E731
    steps = d("ringserve:steps_total")
    t = {p: ph(p) for p in PHASES}
    host = sum(v for p, v in t.items() if p != "decode")
    busy = host + t["decode"]
    return {
        "steps": steps, "decodes": d("llamacpp:n_decode_total"),
        "tokens_per_step": d("ringserve:batch_tokens_total") / steps if steps else math.nan,
        "seconds": t, "idle_s": ph("idle"), "host_s": host, "busy_s": busy,
        "ms_per_step": {p: 1e3 * v / steps if steps else math.nan for p, v in t.items()},
        "host_ms_per_step": 1e3 * host / steps if steps else math.nan,
        "host_share": host / busy if busy else math.nan,
    }


def _med(xs: list[float]) -> float:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return float(np.median(xs)) if xs else math.nan


def summary_rows(cells: list[dict], servers: list[str], modes: list[str], concs: list[int]) -> list[dict]:
    """One row per (mode, concurrency, server): medians over rounds, latency
    percentiles over all rounds' requests pooled, ratios against ringserve."""
    by = {}
    for cl in cells:
        by.setdefault((cl["mode"], cl["concurrency"], cl["server"]), []).append(cl)
    rows = []
    for mode in modes:
        for c in concs:
            base = {cl["round"]: cl for cl in by.get((mode, c, BASE), [])}
            for srv in servers:
                rs = by.get((mode, c, srv))
                if not rs:
                    continue
                raw = [r for cl in rs for r in cl["_raw"] if r.ok] if all("_raw" in cl for cl in rs) else []
                row = {
                    "mode": mode, "concurrency": c, "server": srv, "rounds": len(rs),
                    "requests": sum(cl["requests"] for cl in rs), "completed": sum(cl["completed"] for cl in rs),
                    "errors": sum(len(cl["errors"]) for cl in rs),
                    "req_per_s": _med([cl["req_per_s"] for cl in rs]),
                    "tok_per_s": _med([cl["tok_per_s"] for cl in rs]),
                    "tok_per_s_rounds": [cl["tok_per_s"] for cl in rs],
                    "ttft_ms": loadgen.pct([r.ttft for r in raw if math.isfinite(r.ttft)]),
                    "tpot_ms": loadgen.pct([(r.latency - r.ttft) / (r.n_out - 1) for r in raw if r.n_out > 1]),
                    "itl_ms": loadgen.pct([x for r in raw for x in r.itl]),
                    "md5_all": rs[0]["md5_all"],
                }
                cpus = [cl["cpu_ms_per_token"] for cl in rs if cl.get("cpu_ms_per_token")]
                if cpus:
                    row["cpu_ms_per_token"] = {k: _med([c.get(k, 0.0) for c in cpus]) for k in cpus[0]}
                pairs = [(base[cl["round"]], cl) for cl in rs if cl["round"] in base]
                if srv == BASE:  # determinism: every round against round 1
                    ref = rs[0]["md5"]
                    same = [sum(cl["md5"].get(k) == v for k, v in ref.items()) for cl in rs[1:]]
                    row["same_md5"] = (sum(same), len(ref) * len(same)) if same else None
                    row["ratio_tok"] = row["ratio_ttft_p50"] = None
                else:
                    tot = sum(len(b["md5"]) for b, _ in pairs)
                    row["same_md5"] = (sum(cl["md5"].get(k) == v for b, cl in pairs for k, v in b["md5"].items()), tot)
                    row["ratio_tok_pairs"] = [b["tok_per_s"] / cl["tok_per_s"] for b, cl in pairs if cl["tok_per_s"]]
                    row["ratio_ttft_p50_pairs"] = [b["ttft_ms"][0] / cl["ttft_ms"][0] for b, cl in pairs
                                                   if cl["ttft_ms"][0]]
                    row["ratio_tok"] = _med(row["ratio_tok_pairs"])
                    row["ratio_ttft_p50"] = _med(row["ratio_ttft_p50_pairs"])
                rows.append(row)
    return rows


def phase_rows(cells: list[dict], modes: list[str], concs: list[int]) -> list[dict]:
    """ringserve's phase figures per (mode, concurrency), all rounds summed."""
    rows = []
    for mode in modes:
        for c in concs:
            ps = [cl["phases"] for cl in cells if cl["server"] == BASE and cl["mode"] == mode
                  and cl["concurrency"] == c and cl["phases"]]
            toks = [cl["tok_per_s"] for cl in cells if cl["server"] == BASE and cl["mode"] == mode
                    and cl["concurrency"] == c]
            if not ps:
                continue
            steps = sum(p["steps"] for p in ps)
            sec = {ph: sum(p["seconds"][ph] for p in ps) for ph in PHASES}
            host = sum(v for k, v in sec.items() if k != "decode")
            busy = host + sec["decode"]
            rows.append({
                "mode": mode, "concurrency": c, "steps": steps, "tok_per_s": _med(toks),
                "tokens_per_step": _med([p["tokens_per_step"] for p in ps]),
                "ms_per_step": {k: 1e3 * v / steps if steps else math.nan for k, v in sec.items()},
                "host_ms_per_step": 1e3 * host / steps if steps else math.nan,
                "host_share": host / busy if busy else math.nan,
                "idle_s": sum(p["idle_s"] for p in ps),
            })
    return rows


def _f(x, fmt: str = ".1f") -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)


def _p3(xs: list[float]) -> str:
    return "/".join(_f(x, ".0f" if x >= 100 else ".1f") if math.isfinite(x) else "-" for x in xs)


def print_tables(rows: list[dict], ph: list[dict], out: TextIO, args) -> None:
    """Markdown tables (paste-able into docs/PERFORMANCE.md)."""
    rate = "closed loop" if math.isinf(args.request_rate) else f"Poisson {args.request_rate}/s"
    print(f"\n{rate}; prompt ~12 tokens, {args.gen} generated (ignore_eos), streaming, -t {args.threads}, "
          f"-fa {args.flash_attn}, {args.rounds} round(s) A B A B; latency in ms as p50/p90/p99; "
          "rs÷ = ringserve over this server, median of pair ratios (TTFT: < 1 is ringserve faster); "
          "same md5: outputs equal to ringserve's in the same round (ringserve: later rounds vs round 1)\n", file=out)
    hdr = ("| mode | c | server | req/s | tok/s | rs÷ tok/s | TTFT ms | rs÷ TTFT p50 | TPOT ms | ITL ms "
           "| done | md5 | same md5 |")
    print(hdr, file=out)
    print("|" + "---|" * (hdr.count("|") - 1), file=out)
    for r in rows:
        same = r.get("same_md5")
        print(f"| {r['mode']} | {r['concurrency']} | {r['server']} | {_f(r['req_per_s'], '.2f')} "
              f"| {_f(r['tok_per_s'])} | {_f(r['ratio_tok'], '.2f')} | {_p3(r['ttft_ms'])} "
              f"| {_f(r['ratio_ttft_p50'], '.2f')} | {_p3(r['tpot_ms'])} | {_p3(r['itl_ms'])} "
              f"| {r['completed']}/{r['requests']} | {r['md5_all'][:8]} "
              f"| {f'{same[0]}/{same[1]}' if same else '-'} |", file=out)
    print_cpu(cells_cpu(rows), out)
    if not ph:
        return
    print("\nringserve engine phases (from /metrics): ms per decode step, host = all but llama_decode\n", file=out)
    hdr = "| mode | c | tok/s | steps | tokens/step | " + " | ".join(PHASES) + " | host ms | host share | idle s |"
    print(hdr, file=out)
    print("|" + "---|" * (hdr.count("|") - 1), file=out)
    for r in ph:
        ms = " | ".join(_f(r["ms_per_step"][p], ".2f") for p in PHASES)
        print(f"| {r['mode']} | {r['concurrency']} | {_f(r['tok_per_s'])} | {r['steps']:.0f} "
              f"| {_f(r['tokens_per_step'], '.1f')} | {ms} | {_f(r['host_ms_per_step'], '.2f')} "
              f"| {_f(100 * r['host_share'], '.1f')}% | {_f(r['idle_s'], '.2f')} |", file=out)


def plot(rows: list[dict], path: str) -> None:
    """Tokens/s and TTFT p50 against concurrency, a line per server and mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    series: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        series.setdefault((r["server"], r["mode"]), []).append(r)
    names = list(dict.fromkeys(r["server"] for r in rows))
    colour = {n: f"C{i}" for i, n in enumerate(names)}  # one colour per server, one line style per mode
    for (srv, mode), rs in sorted(series.items(), key=lambda kv: (names.index(kv[0][0]), kv[0][1])):
        rs.sort(key=lambda r: r["concurrency"])
        x = [r["concurrency"] for r in rs]
        kw = dict(color=colour[srv], linestyle="-" if mode == "greedy" else "--", marker="o", label=f"{srv} ({mode})")
        ax1.plot(x, [r["tok_per_s"] for r in rs], **kw)
        ax2.plot(x, [r["ttft_ms"][0] for r in rs], **kw)
    concs = sorted({r["concurrency"] for r in rows})
    for ax, title in ((ax1, "output tokens/s (higher is better)"), (ax2, "TTFT p50, ms (lower is better)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(concs, [str(c) for c in concs])
        ax.set_xlabel("concurrent streams (= slots)")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
    ax2.set_yscale("log")
    ax1.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


ROLES = ("engine", "http", "supervisor", "server")


def cells_cpu(rows: list[dict]) -> list[dict]:
    """The summary rows that carry CPU figures (see summary_rows)."""
    return [r for r in rows if r.get("cpu_ms_per_token")]


def print_cpu(rows: list[dict], out: TextIO) -> None:
    """CPU ms per output token by process role, median over rounds. On two
    cores the decode threads want both; every other CPU millisecond per
    token is taken from them, so this is where a server's HTTP side costs."""
    if not rows:
        return
    print("\nCPU ms per output token by process (user + system, median over rounds; decode threads included "
          "in engine / server)\n", file=out)
    print("| mode | c | server | " + " | ".join(ROLES) + " | total |", file=out)
    print("|" + "---|" * (len(ROLES) + 4), file=out)
    for r in rows:
        cpu = r["cpu_ms_per_token"]
        cols = " | ".join(_f(cpu[k], ".2f") if k in cpu else "-" for k in ROLES)
        print(f"| {r['mode']} | {r['concurrency']} | {r['server']} | {cols} | {_f(sum(cpu.values()), '.2f')} |",
              file=out)
