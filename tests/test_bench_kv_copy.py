"""scripts/bench_kv_copy.py --quick: KV moved between per-slot streams by
llama_state_seq_get/set_data and seq_cp gives bit-identical logits, and
the sliding-window facts the RAM tier's design rests on still hold in this
llama.cpp (timings are not asserted)."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bench_kv_copy_quick():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_kv_copy.py"), "--quick", "--json"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    res = json.loads(lines[-1])
    table = [x for x in lines if x.startswith("| ") and x[2].isdigit()]
    assert len(table) >= len(res["rows"]) + len(res["steps_ms"]) >= 4
    ex = res["exact"]
    for k in ("get_set", "round_trip", "seq_cp", "long_full_pair", "long_full_seq_cp",
              "long_full_both_restored", "cut_then_copy_pair"):
        assert ex[k]["equal"] and ex[k]["max_diff"] == 0, (k, ex[k])
    n, w = ex["long_n"], ex["n_swa"]
    assert w > 0 and n >= 3 * w
    assert ex["long_pos_min"] == 0  # swa_full, own stream: nothing below the window is overwritten
    assert ex["cut_src_pos_min"] == 0  # the cut test's A is a full own stream again (refilled or seq_cp'd)
    assert tuple(ex["copy_pos"]) == (n - w, n - 1)  # get_data carries only the window of SWA cells
    assert tuple(ex["cut_pos"]) == (-1, -1)  # so a copy cut below it has no SWA cell left
    assert not ex["long_cut"]["equal"]
    assert tuple(ex["cut_then_copy_pos"]) == (n // 2 - w, n // 2 - 1)
    for r in res["rows"]:
        assert r["bytes"] > 0 and r["get_ms"] > 0 and r["set_ms"] > 0
