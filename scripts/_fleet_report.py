"""scripts/bench_fleet.py's report: the tables, the ratios against nginx,
issue 23's goals and the plot, from the runs and kills it gathered.

Why a module of its own: bench_fleet.py runs the fleets (scripts/_fleet.py
holds their pieces), this reads what they measured. Nothing here starts a
process or sends a request: the same runs always print the same tables.
Against nginx least_conn means medians over rounds, divided by nginx's, so
a front-end's ratio is only as steady as the rounds behind both.
"""
from __future__ import annotations

import math

import numpy as np
from bench_mixed import f, med
from bench_serving import save_fig


def ratios(runs: list[dict]) -> dict:
    """Each front-end against nginx (medians over rounds): eval÷floor, later-turn TTFT p50, out tok/s."""
    out: dict = {}
    div = lambda a, b: a / b if b else math.nan  # noqa: E731
    for name in dict.fromkeys(r["workload"] for r in runs):
        base = [r for r in runs if r["workload"] == name and r["front"] == "nginx"]
        if not base:
            continue
        b_ev = med([r["evaluated"] / max(r["floor"], 1) for r in base])
        b_tt, b_tp = med([r["ttft_later"][0] for r in base]), med([r["out_tok_s"] for r in base])
        for key in dict.fromkeys(r["front"] for r in runs if r["workload"] == name):
            rs = [r for r in runs if r["workload"] == name and r["front"] == key]
            out.setdefault(name, {})[key] = {
                "eval_floor": med([r["evaluated"] / max(r["floor"], 1) for r in rs]),
                "eval_floor_vs_nginx": div(med([r["evaluated"] / max(r["floor"], 1) for r in rs]), b_ev),
                "ttft_later_vs_nginx": div(med([r["ttft_later"][0] for r in rs]), b_tt),
                "tok_s_vs_nginx": div(med([r["out_tok_s"] for r in rs]), b_tp)}
    return out


def print_tables(runs: list[dict], kills: list[dict], args, out) -> None:
    print(f"\n{args.instances} instances x {args.slots} slots, -t {args.threads} each, {args.ctx_per_slot} context "
          f"per slot; {args.clients} clients; /v1/chat/completions streaming, greedy, ignore_eos; TTFT ms; "
          "evaluated = the instances' llamacpp:prompt_tokens_total; floor = templated prompt tokens no earlier "
          "prompt or answer starts with; per instance: requests, evaluated tokens\n", file=out)
    for name in dict.fromkeys(r["workload"] for r in runs):
        rs = [r for r in runs if r["workload"] == name]
        print(f"**{name}**: {rs[0]['title']}\n", file=out)
        print("| front-end | requests ok | prompt evaluated | floor | eval÷floor | TTFT p50 turn 0 "
              "| later-turn TTFT p50 / p90 | wall s | out tok/s | requests per instance | evaluated per instance |",
              file=out)
        print("|---|---|---|---|---|---|---|---|---|---|---|", file=out)
        for r in rs:
            per = r["per_instance"]
            print(f"| {r['label']}{'' if args.rounds == 1 else ' r' + str(r['round'] + 1)} | {r['ok']}/{r['requests']} "
                  f"| {r['evaluated']:,} | {r['floor']:,} | {f(r['evaluated'] / max(r['floor'], 1), '.2f')} "
                  f"| {f(r['ttft_first_p50'])} | {f(r['ttft_later'][0])} / {f(r['ttft_later'][1])} "
                  f"| {f(r['wall_s'], '.1f')} | {f(r['out_tok_s'], '.1f')} "
                  f"| {' / '.join(f(p['requests']) for p in per)} | {' / '.join(f(p['evaluated']) for p in per)} |",
                  file=out)
        multi = [r for r in rs if len(r["ttft_by_turn"]) > 1]
        if multi:
            n = max(len(r["ttft_by_turn"]) for r in multi)
            what = "turn" if name == "chat" else "k-th question of its document"
            print(f"\nTTFT p50 / p90 ms by {what}\n", file=out)
            print("| front-end | " + " | ".join(str(t) for t in range(n)) + " |", file=out)
            print("|---|" + "---|" * n, file=out)
            for r in multi:
                cells = [f"{f(v[0])} / {f(v[1])}" for _, v in sorted(r["ttft_by_turn"].items(), key=lambda kv: int(kv[0]))]
                rn = "" if args.rounds == 1 else f" r{r['round'] + 1}"
                print(f"| {r['label']}{rn} | " + " | ".join(cells + ["-"] * (n - len(cells))) + " |", file=out)
        print(file=out)
    rat = ratios(runs)
    if rat:
        print("against nginx least_conn (medians over rounds)\n", file=out)
        print("| workload | front-end | eval÷floor | ÷ nginx's | later-turn TTFT p50 ÷ nginx's | out tok/s ÷ nginx's |",
              file=out)
        print("|---|---|---|---|---|---|", file=out)
        for name, by in rat.items():
            for key, v in by.items():
                print(f"| {name} | {key} | {f(v['eval_floor'], '.2f')} | {f(v['eval_floor_vs_nginx'], '.2f')} "
                      f"| {f(v['ttft_later_vs_nginx'], '.2f')} | {f(v['tok_s_vs_nginx'], '.2f')} |", file=out)
        print(file=out)
    if kills:
        print(f"kill: closed-loop unique prompts from {args.clients} clients, SIGKILL of one instance's whole tree "
              f"{args.kill_before:g} s in, {args.kill_after:g} s more; in flight = open on it at the kill (client "
              "side / its /metrics just before; with those sent while it died, which its sockets took); failed "
              "sent after = sent once it was dead; last sent = the gateway's last request to it after the kill\n",
              file=out)
        print("| front-end | requests | failed | in flight on killed | failed sent after | sent to it after kill "
              "| last sent s | marked unhealthy s | health-check interval s |", file=out)
        print("|---|---|---|---|---|---|---|---|---|", file=out)
        for k in kills:
            print(f"| {k['label']} | {k['requests']} | {k['failed']} | {k['inflight_on_killed']} / "
                  f"{k['inflight_metrics']} | {k['failed_sent_after_kill']} | {k['sent_to_dead_after_kill']} "
                  f"| {f(k['last_sent_to_dead_s'], '.2f')} | {f(k['unhealthy_after_s'], '.2f')} "
                  f"| {f(k['health_interval_s'], 'g') if k['health_interval_s'] else 'passive'} |", file=out)
        print("\nwhat the failed requests said:\n", file=out)
        for k in kills:
            for e in k["errors"]:
                print(f"* {k['front']}: {e}", file=out)
    gs = goals(runs, kills)
    if gs:
        print("\ngoals, recommended front-end (smg)\n", file=out)
        for g, met, why in gs:
            print(f"* {g}: {'met' if met else 'NOT met'} ({why})", file=out)


def goals(runs: list[dict], kills: list[dict], rec: str = "smg") -> list[tuple[str, bool, str]]:
    """Issue 23's goals for the recommended front-end: (goal, met, the figures)."""
    out = []
    rat = ratios(runs)
    chat, uniq = rat.get("chat", {}).get(rec), rat.get("unique", {}).get(rec)
    if chat:
        out.append(("chat evaluates <= 1.1x the floor", chat["eval_floor"] <= 1.1, f"{chat['eval_floor']:.2f}x"))
        out.append(("chat later-turn TTFT p50 <= 0.6x nginx's", chat["ttft_later_vs_nginx"] <= 0.6,
                    f"{chat['ttft_later_vs_nginx']:.2f}x"))
    if uniq:
        out.append(("unique throughput >= 0.95x nginx's", uniq["tok_s_vs_nginx"] >= 0.95, f"{uniq['tok_s_vs_nginx']:.2f}x"))
    for k in kills:
        if k["front"] == rec:
            out.append(("a killed instance loses only its in-flight requests",
                        k["failed"] <= k["inflight_on_killed"] and not k["failed_sent_after_kill"],
                        f"{k['failed']} failed, {k['inflight_on_killed']} in flight"))
            out.append(("the gateway stops sending to it within its health-check interval",
                        k["last_sent_to_dead_s"] <= k["health_interval_s"],
                        f"last sent {k['last_sent_to_dead_s']:.2f} s after the kill, interval {k['health_interval_s']:g} s"))
    return out


def plot(runs: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["workload"] for r in runs))
    fronts = list(dict.fromkeys(r["front"] for r in runs))
    label = {r["front"]: r["label"] for r in runs}
    first = {(r["workload"], r["front"]): r for r in runs if r["round"] == 0}
    fig, axs = plt.subplots(1, 4, figsize=(20, 4.5))
    x = np.arange(len(names))
    wd = 0.8 / max(len(fronts), 1)
    for k, fr in enumerate(fronts):
        rs = [first.get((n, fr)) for n in names]
        axs[0].bar(x + k * wd, [r["evaluated"] / max(r["floor"], 1) if r else 0 for r in rs], wd, label=label[fr],
                   color=f"C{k}")
        axs[2].bar(x + k * wd, [r["out_tok_s"] if r else 0 for r in rs], wd, color=f"C{k}")
        shares = [max(p["requests"] for p in r["per_instance"]) / max(sum(p["requests"] for p in r["per_instance"]), 1)
                  if r and len(r["per_instance"]) > 1 else 0 for r in rs]
        axs[3].bar(x + k * wd, shares, wd, color=f"C{k}")
        r = first.get(("chat", fr))
        if r and len(r["ttft_by_turn"]) > 1:
            ts = sorted(r["ttft_by_turn"], key=int)
            axs[1].plot([int(t) for t in ts], [r["ttft_by_turn"][t][0] for t in ts], marker="o", color=f"C{k}",
                        label=label[fr])
    for ax, yl, title in ((axs[0], "prompt tokens evaluated ÷ floor", "work done (1 = every prefix reused)"),
                          (axs[2], "output tokens/s", "throughput"),
                          (axs[3], "busiest instance's share of requests", "balance (0.5 = even over two)")):
        ax.set_xticks(x + wd * (len(fronts) - 1) / 2, names)
        ax.set_ylabel(yl)
        ax.set_title(title)
    axs[0].axhline(1.0, color="grey", linestyle=":", linewidth=1)
    axs[0].legend(fontsize=8)
    axs[1].set_xlabel("chat turn")
    axs[1].set_ylabel("TTFT p50, ms")
    axs[1].set_title("multi-turn chat: time to first token by turn")
    axs[1].legend(fontsize=8)
    for ax in axs:
        ax.grid(True, alpha=0.3)
    save_fig(fig, path)
