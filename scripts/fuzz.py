#!/usr/bin/env python3
"""Bad-input fuzz against a running ringserve, driven by its /openapi.json.

Cases come from scripts/_fuzzcases.py (hypothesis; schema-generated bodies,
mutations of valid bodies, byte-level framing) and are sent over raw
sockets, 8 at a time, plus a slow-loris phase (headers trickled a byte at a
time while the rest runs; some finish, some never do). Every answer must
be below 500, every error (HTTP status >= 400, or an error event inside a
stream) must be ``{"error": {"code": <the status>, "message": str, "type":
str}}``, the engine's pid must not change, and a greedy control request
must give the same content before and after.

Usage: python scripts/fuzz.py [N] [--fake] [--seed S] [--quick]
  N defaults to 5000 (the issue's minimum); --fake runs the fake engine
  (frontends/testing/fake_engine.py: fast, for the HTTP side); --quick runs 200 cases on
  the fake engine and 40 on the real one, its slow-loris headers trickled at
  a byte per 10 ms instead of 50 ms.
"""
from __future__ import annotations

import argparse
import collections
import json
import random
import socket
import sys
import threading
import time
import warnings

from hypothesis import HealthCheck, Phase, given, seed as hseed, settings

import _fuzzcases as F
from frontends import testing as S

LIMIT = 65536
FLAGS = ("-c", "2048", "-np", "4", "-t", "2", "-w", "2", "--threads-http", "8", "--metrics", "-n", "8",
         "--max-body", str(LIMIT))
CONTROL = {"prompt": S.PROMPTS[3], "n_predict": 16, "temperature": 0, "cache_prompt": False}


SHARES = {"schema": 0.3, "mutate": 0.4, "raw": 0.3}


def generate(spec: dict, n: int, seed: int) -> list[F.Case]:
    """n cases in SHARES, reproducible for a seed (hypothesis draws them),
    shuffled so every family runs throughout."""
    warnings.filterwarnings("ignore")
    fams = F.families(spec, LIMIT)
    per: list[list[F.Case]] = []
    for k, (name, share) in enumerate(SHARES.items()):
        want, got, rnd = round(n * share), [], 0
        while len(got) < want:
            @hseed(seed * 100 + k * 10 + rnd)
            @given(fams[name])
            @settings(max_examples=want - len(got), database=None, deadline=None, phases=[Phase.generate],
                      suppress_health_check=list(HealthCheck))
            def draw(case: F.Case) -> None:
                got.append(case)

            draw()
            rnd += 1
        per.append(got[:want])
    out = [c for g in per for c in g]
    random.Random(seed).shuffle(out)
    return out


def send(port: int, case: F.Case, timeout: float = 120.0) -> tuple[int, bytes]:
    """(status, de-chunked body); status 0 when no answer came."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    data = b""
    try:
        s.sendall(case.data)
        if case.shut_wr:
            s.shutdown(socket.SHUT_WR)
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    finally:
        s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    try:
        status = int(head.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return 0, data
    if b"transfer-encoding: chunked" in head.lower():
        out, rest = b"", body
        while rest:
            size, _, rest = rest.partition(b"\r\n")
            k = int(size.split(b";")[0] or b"0", 16)
            if k == 0:
                break
            out, rest = out + rest[:k], rest[k + 2:]
        body = out
    return status, body


# Answers in the 5xx range that are documented, llama-server's own, and not
# server errors: an action the server does not offer (slot save/restore
# without --slot-save-path) and "no slot available" (?fail_on_no_slot=1).
DOCUMENTED = {501: "not_supported_error", 503: "unavailable_error"}


def bucket(status: int, body: bytes) -> str:
    if status == 0:
        return "no answer"
    if status in DOCUMENTED and shape(body, status) is None and json.loads(body)["error"]["type"] == DOCUMENTED[status]:
        return "501/503 documented"
    return "5xx" if status >= 500 else f"{status // 100}xx"


def problem(status: int, body: bytes, case: F.Case) -> str | None:
    """Why this answer breaks the contract (None: it does not)."""
    if status == 0:
        return None if not case.expect_answer else "no answer"
    if bucket(status, body) == "5xx":
        return f"{status}: {body[:200]!r}"
    if status >= 400:
        return shape(body, status)
    if body.startswith(b"data: "):
        for line in body.split(b"\n"):
            if line.startswith(b"data: {"):
                ev = json.loads(line[6:])
                if "error" in ev:
                    code = ev["error"].get("code", 0) if isinstance(ev["error"], dict) else 0
                    bad = shape(line[6:], code)
                    if bad or code >= 500:
                        return f"stream error event {line[:200]!r}"
    return None


def shape(body: bytes, status: int) -> str | None:
    try:
        e = json.loads(body)["error"]
        ok = (isinstance(e, dict) and e.get("code") == status and isinstance(e.get("message"), str)
              and isinstance(e.get("type"), str))
    except (ValueError, KeyError, TypeError):
        ok = False
    return None if ok else f"error shape, status {status}: {body[:200]!r}"


def slowloris(port: int, finish: bool, results: list, byte_s: float = 0.05) -> None:
    """Trickle a request's header a byte at a time; finish it or never do."""
    req = F.http("POST", "/tokenize", b'{"content": "slow"}')
    head, _, body = req.partition(b"\r\n\r\n")
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    status, got = 0, b""
    try:
        for i in range(len(head) if finish else min(len(head), 120)):
            s.sendall(head[i:i + 1])
            time.sleep(byte_s)
        if finish:
            s.sendall(b"\r\n\r\n" + body)
            while chunk := s.recv(65536):
                got += chunk
            status = int(got.split(b" ", 2)[1])
    except (OSError, IndexError, ValueError):
        pass
    finally:
        S.reset_close(s)
    results.append((finish, status, got.partition(b"\r\n\r\n")[2]))


def run(n: int, fake: bool, seed: int = 0, width: int = 8, byte_s: float = 0.05) -> dict:
    srv = S.Server(*FLAGS, fake=fake)
    t0 = time.monotonic()
    try:
        spec = json.loads(S.get(srv.url("/openapi.json"))[1])
        cases = generate(spec, n, seed)
        t_gen = time.monotonic() - t0
        pid0 = srv.engine_pid
        c0 = S.post(srv.url("/completion"), CONTROL)
        rss0 = S.rss_kb(pid0)  # after a decode: the engine drops the GGUF's pages at start-up, a decode reads them back
        stats = collections.Counter()
        fails: list[tuple[str, str]] = []
        lock = threading.Lock()
        it = iter(cases)

        def worker() -> None:
            while True:
                with lock:
                    case = next(it, None)
                if case is None:
                    return
                try:
                    status, body = send(srv.port, case)
                    why = problem(status, body, case)
                    kind = bucket(status, body)
                except Exception as e:  # an answer the checks cannot even parse is a failure, not a lost case
                    why, kind = f"unparseable answer: {type(e).__name__}: {e}", "unparseable"
                with lock:
                    stats[f"{case.family} {kind}"] += 1
                    if why:
                        fails.append((case.label, why))

        slow: list = []
        loris = [threading.Thread(target=slowloris, args=(srv.port, i % 2 == 0, slow, byte_s)) for i in range(6)]
        ts = [threading.Thread(target=worker) for _ in range(width)]
        for t in loris + ts:
            t.start()
        for t in ts + loris:
            t.join()
        for finish, status, body in slow:
            stats[f"slow-loris {bucket(status, body)}"] += 1
            if finish and (status != 200 or b"tokens" not in body):
                fails.append(("slow-loris", f"{status} {body[:100]!r}"))
        c1 = S.post(srv.url("/completion"), CONTROL)
        pid1 = srv.engine_pid
        rss1 = S.rss_kb(pid1)
        starts = srv.log().count("engine started: pid")
        alive = S.get(srv.url("/health"))[0]
    finally:
        rc, left = srv.finish()
    return {"n": len(cases) + len(slow), "stats": stats, "fails": fails, "pid": (pid0, pid1), "starts": starts,
            "control": (c0, c1), "health": alive, "rc": rc, "shm_left": left,
            "seconds": time.monotonic() - t0, "gen_s": t_gen, "fake": fake, "rss": (rss0, rss1)}


def report(res: dict) -> tuple[str, bool]:
    (s0, c0), (s1, c1) = res["control"]
    c0, c1 = (c if isinstance(c, dict) else {} for c in (c0, c1))  # post() gives a string on failure
    same = s0 == s1 == 200 and c0.get("content") == c1.get("content")
    fams = sorted({k.split(" ")[0] for k in res["stats"]})
    cols = ["2xx", "4xx", "501/503 documented", "5xx", "no answer"]
    rows = [[f] + [res["stats"].get(f"{f} {c}", 0) for c in cols] for f in fams]
    rows.append(["total"] + [sum(res["stats"].get(f"{f} {c}", 0) for f in fams) for c in cols])
    n5 = rows[-1][4]
    grew = (res["rss"][1] - res["rss"][0]) / 1024
    answered = sum(res["stats"].values())  # every case counted once, whatever became of it
    ok = (answered == res["n"] and not res["fails"] and n5 == 0 and grew < 256 and res["pid"][0] == res["pid"][1] and res["starts"] == 1 and same
          and res["health"] == 200 and res["rc"] == 0 and not res["shm_left"])
    lines = [S.table(["family", *cols], rows), "",
             S.table(["figure", "value", "goal"], [
                 ["requests sent / accounted for", f"{res['n']} / {answered}", ">= 5000 (full run), all"],
                 ["5xx statuses", n5, "0"],
                 ["answers breaking the error shape, error events in streams, missing",
                  len(res["fails"]), "0"],
                 ["engine pid before / after", f"{res['pid'][0]} / {res['pid'][1]}", "unchanged"],
                 ["engine starts in the log", res["starts"], "1"],
                 ["engine RSS before / after, MiB", f"{res['rss'][0] // 1024} / {res['rss'][1] // 1024}",
                  "< +256"],
                 ["greedy control before / after", f"{S.md5(c0.get('content', ''))[:8]} / "
                  f"{S.md5(c1.get('content', ''))[:8]}", "identical"],
                 ["exit code on SIGTERM, /dev/shm left", f"{res['rc']}, {len(res['shm_left'])}", "0, 0"]])]
    for label, why in res["fails"][:15]:
        lines.append(f"FAIL {label}: {why}")
    return "\n".join(lines), ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("n", type=int, nargs="?", default=5000)
    ap.add_argument("--fake", action="store_true", help="the fake engine (HTTP side only, fast)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="200 cases on the fake engine, then 40 on the real one")
    a = ap.parse_args()
    passes = [(200, True), (40, False)] if a.quick else [(a.n, a.fake)]
    byte_s = 0.01 if a.quick else 0.05  # the slow-loris trickle: ~1 s a header instead of ~5 s (the run waits on it)
    ok_all = True
    for n, fake in passes:
        res = run(n, fake, a.seed, byte_s=byte_s)
        text, ok = report(res)
        print(f"fuzz: {res['n']} requests against ringserve with the {'fake' if fake else 'real'} engine, "
              f"seed {a.seed}, {res['seconds']:.0f} s ({res['gen_s']:.0f} s generating)")
        print(text)
        print("PASS" if ok else "FAIL")
        ok_all = ok_all and ok
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
