#!/usr/bin/env python3
"""Closed-loop load generator for llama-server compatible /completion endpoints.

The GPU check kit's loadgen (../shared/gpu-kit/loadgen.py), carried unchanged
in behaviour so scripts/gpu_check.sh needs nothing outside the repository
but the kit's sources and wheels; scripts/gpu_check.py runs several of these
side by side at high stream counts (one Python client process is GIL-bound
near 10k SSE events/s). Stdlib only: it runs on a bare device machine.

Runs C concurrent clients, each sending
requests back to back for a fixed number of requests, streaming or not, and reports
aggregate generated tokens/s, TTFT and inter-token latency percentiles, and an md5
over the sorted (prompt, content) pairs so two servers can be compared for output.

usage: loadgen.py URL --concurrency 8 --requests 32 --n-predict 64 [--stream] [--api-key K]
"""
import argparse, hashlib, http.client, json, sys, threading, time
from urllib.parse import urlparse

PROMPTS = [
    "Once upon a time, in a small village by the sea,",
    "The three most important inventions of the last century are",
    "Write a short poem about the autumn rain:",
    "In computer science, a ring buffer is",
    "The recipe for a simple tomato soup begins with",
    "Dear diary, today I learned that",
    "The history of the Roman empire can be summarised as",
    "A good unit test should always",
]

def one_request(u, prompt, n_predict, stream, api_key, extra, api="native"):
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=600)
    if api == "oai":
        body = {"prompt": prompt, "max_tokens": n_predict, "temperature": 0, "top_k": 1,
                "seed": 42, "stream": stream}
        path = "/v1/completions"
    else:
        body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "top_k": 1,
                "seed": 42, "stream": stream, "cache_prompt": False}
        path = "/completion"
    body.update(extra)
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    t0 = time.perf_counter()
    conn.request("POST", (u.path.rstrip("/") or "") + path, json.dumps(body), headers)
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    times, content, n_tok = [], [], 0
    if stream:
        while True:
            chunk = r.readline()
            if not chunk:
                break
            line = chunk.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                break
            msg = json.loads(data)
            if api == "oai":
                ch = (msg.get("choices") or [{}])[0]
                if ch.get("text"):
                    times.append(time.perf_counter())
                    content.append(ch["text"])
                if msg.get("usage"):
                    n_tok = msg["usage"].get("completion_tokens", 0)
                continue
            if msg.get("content"):
                times.append(time.perf_counter())
                content.append(msg["content"])
            if msg.get("stop"):
                n_tok = msg.get("tokens_predicted", len(times))
                break
    else:
        msg = json.loads(r.read())
        times.append(time.perf_counter())
        if api == "oai":
            content.append(msg["choices"][0]["text"])
            n_tok = msg.get("usage", {}).get("completion_tokens", 0)
        else:
            content.append(msg.get("content", ""))
            n_tok = msg.get("tokens_predicted", 0)
    conn.close()
    t1 = time.perf_counter()
    return {"t0": t0, "t1": t1, "times": times, "content": "".join(content), "n": n_tok or len(times)}

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=None, help="total requests (default 2*concurrency)")
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--api-key")
    ap.add_argument("--extra", default="{}", help="JSON merged into each request body")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--api", choices=["native", "oai"], default="native")
    a = ap.parse_args()
    u = urlparse(a.url)
    total = a.requests or 2 * a.concurrency
    extra = json.loads(a.extra)
    results, errors = [], []
    lock = threading.Lock()
    counter = iter(range(total))
    def worker():
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            p = PROMPTS[i % len(PROMPTS)]
            try:
                res = one_request(u, p, a.n_predict, a.stream, a.api_key, extra, a.api)
                res["prompt"] = p
                with lock:
                    results.append(res)
            except Exception as e:  # noqa
                with lock:
                    errors.append(repr(e))
    T0 = time.perf_counter()
    ths = [threading.Thread(target=worker) for _ in range(a.concurrency)]
    for t in ths: t.start()
    for t in ths: t.join()
    T1 = time.perf_counter()
    toks = sum(r["n"] for r in results)
    ttft = [ (r["times"][0] - r["t0"]) * 1000 for r in results if r["times"]]
    itl = []
    for r in results:
        ts = r["times"]
        itl += [(b - a_) * 1000 for a_, b in zip(ts, ts[1:])]
    md5 = hashlib.md5("\n".join(sorted(set(f"{r['prompt']}\t{r['content']}" for r in results))).encode()).hexdigest()
    def pct(v, q):
        if not v: return float("nan")
        v = sorted(v); return v[min(len(v) - 1, int(q * len(v)))]
    out = {"concurrency": a.concurrency, "requests": len(results), "errors": len(errors),
           "tokens": toks, "wall_s": round(T1 - T0, 3), "tok_per_s": round(toks / (T1 - T0), 2),
           "ttft_p50_ms": round(pct(ttft, .5), 1), "ttft_p99_ms": round(pct(ttft, .99), 1),
           "itl_p50_ms": round(pct(itl, .5), 2), "itl_p99_ms": round(pct(itl, .99), 2),
           "md5": md5, "distinct_outputs": len(set(r["content"] for r in results))}
    if errors:
        out["first_error"] = errors[0]
    print(json.dumps(out) if a.json else "  ".join(f"{k}={v}" for k, v in out.items()))
    return 0 if not errors else 1

if __name__ == "__main__":
    sys.exit(main())
