#!/usr/bin/env python
"""Fleet benchmark: the same ringserve instances behind nginx least_conn
(deploy/nginx.conf) and behind smg (the Shepherd Model Gateway) with its
policies, on prefix-heavy and cache-free workloads, in one run.

Per workload and front-end (with --share-fleet, as --quick: per front-end,
every workload in turn, then the kill), N fresh instances (-t 1, 2 slots
each by default; sharing prompt KV through one fresh --cache-host directory
on /dev/shm, engine/hosttier.py, unless --no-cache-host) start on free
loopback ports, the front-end starts in front of them, and the workload (scripts/_cache_workloads.py: multi-turn chat with
more conversations than slots, shared documents in a shuffled order,
unique prompts) streams through it over /v1/chat/completions (greedy,
ignore_eos). Reported: prompt tokens the instances evaluated (each
instance's own /metrics: llamacpp:prompt_tokens_total) against the floor
(tokens no earlier prompt or answer starts with, counted on the templated
prompt), TTFT p50/p90 by turn, output tokens/s, and requests and evaluated
tokens per instance (the balance). Front-ends run in the order given,
round after round (A B A B with --rounds 2).

--kill: per gateway, closed-loop unique prompts; the first instance's whole
tree gets SIGKILL mid-run. Reported: failed requests against those open on
the dead instance at the kill, and when the gateway last sent it a request
(nginx: its X-Upstream header; smg: its per-worker failure counter) and
marked it unhealthy, against its health-check interval.

  python scripts/bench_fleet.py --kill --plot fleet.png          # the full run (~12 min)
  python scripts/bench_fleet.py --fronts nginx,smg --workloads chat
  python scripts/bench_fleet.py --quick --json                  # the test suite's
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import _cache_workloads as W
import _fleet as F
from _fleet_report import goals, plot, print_tables, ratios
from bench_cache import figures
from bench_servers import run_rounds
from bench_serving import _clean, bench_setup, default_model

ALL = ("chat", "prefix", "unique")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("-m", "--model", default="", help="GGUF (default: ringserve's default model)")
    a("--fronts", default="nginx,smg,smg-nokey,smg-default", help=f"comma list of {', '.join(F.FRONTS)}, one (a single "
      "instance with N x the threads and slots, no gateway)")
    a("--workloads", default=",".join(ALL), help=f"comma list of {', '.join(ALL)}")
    a("-n", "--instances", type=int, default=2)
    a("--slots", type=int, default=2, help="slots per instance")
    a("-t", "--threads", type=int, default=1, help="engine threads per instance")
    a("-c", "--ctx-per-slot", type=int, default=4096)
    a("--clients", type=int, default=4)
    a("--chat-convs", type=int, default=16)
    a("--chat-turns", type=int, default=4)
    a("--chat-shuffle", action="store_true", help="chat: each turn's conversations in a seeded random order (the "
      "default turn-major order with an even count lets a round-robin tie-break send a conversation back to its "
      "instance every turn)")
    a("--prefix-groups", type=int, default=4, help="shared documents (~1,000 tokens each)")
    a("--prefix-questions", type=int, default=6, help="questions per document")
    a("--unique-prompts", type=int, default=24)
    a("--rounds", type=int, default=1, help="rounds of every front-end per workload")
    a("--seed", type=int, default=1234)
    a("--kill", nargs="?", const="all", default="",
      help="the kill scenario, once per gateway (all), or behind the named ones (--kill smg)")
    a("--kill-before", type=float, default=4.0, help="seconds of load before the kill")
    a("--kill-after", type=float, default=8.0, help="seconds of load after it")
    a("--ringserve-args", default="", help="extra flags for every instance")
    a("--cache-host", action=argparse.BooleanOptionalAction, default=True,
      help="the instances of a fleet share prompt KV through a fresh tmpfs directory (--cache-host; "
           "--no-cache-host: each instance its own cache only)")
    a("--smg-args", default="", help="extra flags for every smg front-end")
    a("--timeout", type=float, default=300.0, help="per request, seconds")
    a("--plot", default="", help="PNG: evaluated / floor, TTFT p50 by turn, throughput, balance")
    a("--json", action="store_true", help="JSON on stdout (the tables go to stderr)")
    a("--share-fleet", action="store_true", help="per front-end and round, one start of the instances for every "
      "workload and then the kill (the floor over all a start was sent)")
    a("--quick", action="store_true", help="tiny chat and unique workloads, short kill, --share-fleet: "
      "completeness only")
    args = p.parse_args(argv)
    args.names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    args.front_keys = [x.strip() for x in args.fronts.split(",") if x.strip()]
    bad = [w for w in args.names if w not in ALL] + [x for x in args.front_keys if x not in F.FRONTS and x != "one"]
    if bad:
        p.error(f"unknown workload(s) or front-end(s) {bad}")
    if args.quick:
        args.rounds, args.ctx_per_slot, args.clients, args.kill_before, args.kill_after = 1, 1024, 4, 1.5, 3.0
        args.share_fleet = True
        if args.workloads == ",".join(ALL):
            args.names = ["chat", "unique"]
    return args


def front_of(key: str, args) -> F.Front:
    if key == "one":
        return F.Front("one", f"one instance (-t {args.threads * args.instances}, "
                       f"{args.slots * args.instances} slots), no gateway", "direct")
    fr = F.FRONTS[key]
    return dataclasses.replace(fr, flags=fr.flags + tuple(args.smg_args.split())) if fr.kind == "smg" else fr


class Fleet:
    """Fresh instances and their front-end for one run; stops both."""

    def __init__(self, front: F.Front, args, model: str):
        n = 1 if front.kind == "direct" else args.instances
        k = args.instances if front.kind == "direct" else 1
        # the host tier: one fresh directory per fleet, which the instances remove when the last one stops
        self.shared = F.host_dir() if args.cache_host and n > 1 else ""
        extra = args.ringserve_args.split() + (["--cache-host", self.shared] if self.shared else [])
        self.insts = F.start_instances(n, model, args.slots * k, args.slots * k * args.ctx_per_slot,
                                       args.threads * k, extra)
        self.gw = None
        try:
            self.gw = None if front.kind == "direct" else F.Gateway(front, self.insts)
        except BaseException:
            F.stop_instances(self.insts)
            raise
        self.port = self.gw.port if self.gw else self.insts[0].port
        self.cmd = self.gw.cmd if self.gw else self.insts[0].cmd

    def stop(self) -> list[str]:
        if self.gw is not None:
            self.gw.stop()
        return F.stop_instances(self.insts) + F.clear_host_dir(self.shared)


def one_run(front: F.Front, name: str, rnd: int, args, model: str, tok: W.Tokens, tmpl, bar, problems, cmds,
            fleet: Fleet | None = None, seen: list | None = None) -> dict:
    """One workload through ``front``: on fresh instances, or on ``fleet``
    (--share-fleet; ``seen``: what it was sent before, for the floor)."""
    sizes = W.sizes(args)
    w = dataclasses.replace(W.build(name, args.quick, args.seed, sizes), clients=args.clients)
    # sticky sessions: the client names what a request continues (chat: its conversation; shared
    # documents: the document; unique prompts: the prompt, a key of its own)
    session = ("document" if name == "prefix" else "conversation") if "--sticky-sessions" in front.flags else ""
    bar.set_description(f"{name} r{rnd + 1} {front.key}: starting")
    fl = fleet or Fleet(front, args, model)
    try:
        cmds.setdefault(front.key, fl.cmd)
        cmds.setdefault("instance", fl.insts[0].cmd)
        bar.set_description(f"{name} r{rnd + 1} {front.key}")
        before = F.counters(fl.insts)
        recs, wall = W.run(fl.port, w, tok, args.timeout, {}, lambda _r: bar.update(1),
                           F.chat_wire(F.model_id(fl.insts[0]), w.n_predict, tmpl, session), seen)
        per = F.delta(F.counters(fl.insts), before)
    finally:
        if fleet is None:
            problems += fl.stop()
    errs = [f"{name} {front.key} r{rnd + 1} conv {r['conv']} turn {r['turn']}: {r['error']}" for r in recs if not r["ok"]]
    problems += errs[:5]
    fig = figures(recs, wall)
    fig["evaluated_timings"] = fig.pop("evaluated")  # what the responses' timings said, beside the instances' count
    return {"workload": name, "title": w.title, "front": front.key, "label": front.label, "round": rnd,
            "wall_s": wall, "per_instance": per, "evaluated": int(sum(p["evaluated"] for p in per)),
            "records": recs, **fig}


def kill_run(front: F.Front, args, model: str, bar, fleet: Fleet | None = None) -> dict:
    """The kill scenario behind ``front``: on fresh instances, or on ``fleet`` (which the caller stops)."""
    bar.set_description(f"kill {front.key}: starting")
    fl = fleet or Fleet(front, args, model)
    dead = f"{F.HOST}:{fl.insts[0].port}"
    try:
        bar.set_description(f"kill {front.key}")
        run = F.kill_scenario(fl.gw, fl.insts, F.model_id(fl.insts[0]), args.clients, 4 if args.quick else 32,
                              args.kill_before, args.kill_after, args.timeout, lambda _r: bar.update(1))
    finally:
        if fleet is None:
            fl.stop()
    return F.kill_figures(run, dead, front)


def wants_kill(front: F.Front, args) -> bool:
    return bool(args.kill) and front.kind != "direct" and (args.kill == "all" or front.key in args.kill.split(","))


def shared_fleet(front: F.Front, rnd: int, args, model: str, tok: W.Tokens, tmpl, bar, problems, cmds,
                 runs: list, kills: list) -> None:
    """--share-fleet: one start of the instances and ``front`` for every
    workload of round ``rnd`` in turn (the floor over all they were sent),
    then, in the last round, the kill scenario on the same fleet (it kills
    an instance: last). Appends to ``runs`` and ``kills`` as each ends."""
    bar.set_description(f"r{rnd + 1} {front.key}: starting")
    fl = Fleet(front, args, model)
    seen: list = []
    try:
        for name in args.names:
            runs.append(one_run(front, name, rnd, args, model, tok, tmpl, bar, problems, cmds, fl, seen))
        if rnd == args.rounds - 1 and wants_kill(front, args):
            kills.append(kill_run(front, args, model, bar, fl))
    finally:
        problems += fl.stop()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    fronts = [front_of(k, args) for k in args.front_keys]
    missing = sorted({fr.kind for fr in fronts if fr.kind != "direct" and not (F.NGINX if fr.kind == "nginx" else F.SMG)})
    if missing:
        sys.exit(f"not found: {', '.join(missing)} (nginx: apt-get install nginx-light; smg: pip install smg; "
                 "or $NGINX / $SMG)")
    tqdm = bench_setup()
    model = args.model or default_model()
    tok = W.Tokens(model)
    tmpl = F.chat_template(tok)
    sizes = W.sizes(args)
    total = sum(len(W.build(n, args.quick, args.seed, sizes).order) for n in args.names) * len(fronts) * args.rounds
    runs: list[dict] = []
    kills: list[dict] = []
    problems: list[str] = []
    cmds: dict[str, list[str]] = {}
    bar = tqdm(total=total, unit="req", file=sys.stderr, mininterval=0.5, dynamic_ncols=True)
    try:
        if args.share_fleet:
            for rnd in range(args.rounds):
                for fr in fronts:
                    try:
                        shared_fleet(fr, rnd, args, model, tok, tmpl, bar, problems, cmds, runs, kills)
                    except (RuntimeError, TimeoutError) as e:
                        problems.append(f"r{rnd + 1} {fr.key}: {e}"[:2000])
            runs.sort(key=lambda r: (args.names.index(r["workload"]), r["round"]))  # the tables' order
        else:
            run_rounds(runs, args.names, args.rounds, fronts, lambda fr: fr.key,
                       lambda fr, name, rnd: one_run(fr, name, rnd, args, model, tok, tmpl, bar, problems, cmds),
                       problems, bar, (RuntimeError, TimeoutError))
        for fr in fronts if args.kill and not args.share_fleet else ():
            if wants_kill(fr, args):
                try:
                    kills.append(kill_run(fr, args, model, bar))
                except (RuntimeError, TimeoutError) as e:
                    problems.append(f"kill {fr.key}: {e}"[:2000])
    except KeyboardInterrupt as e:
        problems.append(f"interrupted by {e or 'SIGINT'}")
    finally:
        bar.close()
        tok.close()
    out = sys.stderr if args.json else sys.stdout
    print_tables(runs, kills, args, out)
    for key, cmd in cmds.items():
        print(f"{key}: {' '.join(cmd)}", file=out)
    for pr in problems:
        print(f"problem: {pr}", file=out)
    if args.plot and runs:
        plot(runs, args.plot)
        print(f"plot: {args.plot}", file=out)
    ok = not problems and len(runs) == len(args.names) * len(fronts) * args.rounds
    if args.json:
        doc = {"ok": ok, "model": model, "fronts": [dataclasses.asdict(fr) for fr in fronts], "commands": cmds,
               "settings": {k: v for k, v in vars(args).items() if k not in ("json", "plot")},
               "runs": runs, "ratios": ratios(runs), "kills": kills, "problems": problems,
               "goals": [{"goal": g, "met": m, "figures": w} for g, m, w in goals(runs, kills)]}
        json.dump(_clean(doc), sys.stdout, indent=1, allow_nan=False)
        print()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
