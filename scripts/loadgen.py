"""Load generator for scripts/bench_serving.py: streaming HTTP clients and the
vLLM ``bench serve`` metrics.

Why its own module, and why plain ``http.client`` with one thread per stream:
the client shares a 2-core machine with the servers under test, so it must
cost as little CPU as possible and the same for every server. A thread per
stream blocked in ``recv`` costs nothing while it waits; an asyncio/aiohttp
stack would add its own per-event overhead and dependencies. At 32 streams x
a few tokens/s the GIL is never the bottleneck.

Metric definitions follow vLLM's ``benchmarks/serve.py``:

* TTFT: send -> first token event, per request;
* TPOT: (latency - TTFT) / (output tokens - 1), per request;
* ITL: every gap between consecutive token events, all requests pooled;
* request throughput: completed requests / duration; output throughput:
  output tokens / duration, duration = first send -> last completion.
"""
from __future__ import annotations

import http.client
import json
import math
import queue
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from frontends.testing import md5  # one md5 for every script (a lone surrogate must not crash it)

# ~12-token prompts, distinct from their first word on (no shared prefix, so
# prompt caching cannot favour either server).
_LEAD = ("Amber", "Bright", "Cold", "Distant", "Early", "Faded", "Golden", "Hidden", "Icy", "Jolly",
         "Keen", "Lonely", "Misty", "Narrow", "Old", "Pale", "Quiet", "Rapid", "Silent", "Tall",
         "Upper", "Vast", "Warm", "Young", "Ancient", "Broken", "Curious", "Dark", "Empty", "Frozen",
         "Gentle", "Heavy")
_THING = ("lighthouse", "river", "mountain", "garden", "harbour", "forest", "desert", "village",
          "castle", "island", "bridge", "market")


def make_prompts(n: int) -> list[str]:
    """n distinct prompts of about 12 tokens; prompt i is the same in every
    cell and round, so output md5s can be compared across servers and rounds."""
    out = []
    for i in range(n):
        lead = _LEAD[i % len(_LEAD)]
        thing = _THING[(i // len(_LEAD) + i) % len(_THING)]
        out.append(f"{lead} tale {i}: the {thing} keeper wrote that")
    return out


@dataclass
class Result:
    """One request as the client saw it (times: perf_counter seconds)."""

    index: int
    ok: bool = False
    error: str = ""
    t_send: float = 0.0
    ttft: float = math.nan
    latency: float = math.nan
    itl: list[float] = field(default_factory=list)
    n_out: int = 0  # output tokens (server-reported where it reports them)
    n_prompt: int = 0  # prompt tokens (server-reported; 0 if not)
    text: str = ""
    final: dict | None = None  # what the API adapter took from the last event (timings, counts)
    headers: dict = field(default_factory=dict)  # the response's (lower-case names: which upstream answered)


# An API adapter turns (prompt, index) into a request and SSE payloads into
# token events: parse(obj) -> (is_token_event, text_piece, final_info | None).
@dataclass
class Api:
    path: str
    body: Callable[[str, int], dict]
    parse: Callable[[dict], tuple[bool, str, dict | None]]
    headers: Callable[[str, int], dict] | None = None  # extra request headers (a gateway's routing key)


def native_api(gen: int, sampling: dict, seed: int, cache_prompt: bool) -> Api:
    """llama-server's /completion (ringserve speaks the same)."""

    def body(prompt: str, i: int) -> dict:
        return {"prompt": prompt, "n_predict": gen, "stream": True, "ignore_eos": True,
                "cache_prompt": cache_prompt, "seed": seed + i, **sampling}

    def parse(obj: dict) -> tuple[bool, str, dict | None]:
        if obj.get("stop"):
            return False, obj.get("content", ""), {"n_out": obj.get("tokens_predicted"),
                                                   "n_prompt": obj.get("tokens_evaluated", 0)}
        return True, obj.get("content", ""), None

    return Api("/completion", body, parse)


def openai_api(gen: int, sampling: dict, seed: int, eog_bias: dict[str, float]) -> Api:
    """/v1/completions streaming (llama-cpp-python's server). It has no
    ignore_eos, so end-of-generation tokens get a -1e9 logit bias instead."""

    def body(prompt: str, i: int) -> dict:
        return {"prompt": prompt, "max_tokens": gen, "stream": True, "seed": seed + i,
                "logit_bias": eog_bias, **sampling}

    def parse(obj: dict) -> tuple[bool, str, dict | None]:
        ch = (obj.get("choices") or [{}])[0]
        text = ch.get("text") or ""
        if ch.get("finish_reason"):  # "length": max_tokens were generated
            return bool(text), text, {"n_out": gen if ch["finish_reason"] == "length" else None}
        return True, text, None

    return Api("/v1/completions", body, parse)


def stream_one(port: int, api: Api, prompt: str, index: int, timeout: float) -> Result:
    """POST one streaming request and time every SSE event as it arrives."""
    r = Result(index)
    payload = json.dumps(api.body(prompt, index)).encode()
    clock = time.perf_counter
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    pieces: list[str] = []
    times: list[float] = []
    final: dict | None = None
    try:
        r.t_send = clock()
        conn.request("POST", api.path, payload, {"Content-Type": "application/json",
                                                 **(api.headers(prompt, index) if api.headers else {})})
        resp = conn.getresponse()
        r.headers = {k.lower(): v for k, v in resp.getheaders()}
        if resp.status != 200:
            r.error = f"HTTP {resp.status}: {resp.read(300).decode('utf-8', 'replace')}"
            return r
        buf = b""
        done = False
        while not done:
            chunk = resp.read1(65536)
            if not chunk:
                break
            now = clock()
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for ln in lines:
                if ln.startswith(b"error:"):
                    r.error = ln.decode("utf-8", "replace")[:300]
                    return r
                if not ln.startswith(b"data: "):
                    continue
                data = ln[6:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                is_tok, text, fin = api.parse(json.loads(data))
                pieces.append(text)
                if is_tok:
                    times.append(now)
                if fin is not None:
                    final = fin
                    if api.path == "/completion":
                        done = True
                        break
        t_end = clock()
    except (OSError, http.client.HTTPException, ValueError) as e:
        r.error = f"{type(e).__name__}: {e}"[:300]
        return r
    finally:
        conn.close()
    if final is None:
        r.error = f"stream ended without a final event after {len(times)} tokens"
        return r
    r.text = "".join(pieces)
    r.final = final
    r.n_out = int(final["n_out"]) if final.get("n_out") is not None else len(times)
    r.n_prompt = int(final.get("n_prompt") or 0)
    if times:
        r.ttft = times[0] - r.t_send
        r.itl = [b - a for a, b in zip(times, times[1:])]
    r.latency = t_end - r.t_send
    r.ok = True
    return r


def drive(port: int, api: Api, prompts: list[str], concurrency: int, rate: float, seed: int,
          timeout: float, on_done: Callable[[Result], None] | None = None) -> tuple[list[Result], float]:
    """Run every prompt once with at most ``concurrency`` in flight.

    rate = inf: closed loop (a stream sends its next request as soon as the
    previous one ends). Finite rate: Poisson arrivals (exponential gaps,
    seeded), still capped at ``concurrency`` in flight as vLLM's
    --max-concurrency does. Returns the results in prompt order and the
    duration (first send -> last completion).
    """
    todo: queue.Queue = queue.Queue()
    results: list[Result | None] = [None] * len(prompts)

    def feeder() -> None:
        rng = random.Random(seed)
        t = time.perf_counter()
        for i in range(len(prompts)):
            if math.isfinite(rate):
                t += rng.expovariate(rate)
                time.sleep(max(t - time.perf_counter(), 0.0))
            todo.put(i)
        for _ in range(concurrency):
            todo.put(None)

    def worker() -> None:
        while (i := todo.get()) is not None:
            res = stream_one(port, api, prompts[i], i, timeout)
            results[i] = res
            if on_done is not None:
                on_done(res)

    threads = [threading.Thread(target=feeder, daemon=True)]
    threads += [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    out = [r for r in results if r is not None]
    ends = [r.t_send + r.latency for r in out if r.ok]
    starts = [r.t_send for r in out if r.t_send]
    duration = (max(ends) - min(starts)) if ends else time.perf_counter() - t0
    return out, duration


def pct(xs: list[float], ps: tuple[float, ...] = (50, 90, 99)) -> list[float]:
    """Percentiles in milliseconds (NaN for no data)."""
    if not xs:
        return [math.nan] * len(ps)
    return [float(v) * 1e3 for v in np.percentile(np.asarray(xs), ps)]


def summarize(results: list[Result], duration: float, gen: int) -> dict:
    """The cell's figures, vLLM bench-serve style, plus completeness and md5s."""
    ok = [r for r in results if r.ok]
    complete = [r for r in ok if r.n_out == gen]
    n_out = sum(r.n_out for r in ok)
    tpot = [(r.latency - r.ttft) / (r.n_out - 1) for r in ok if r.n_out > 1 and math.isfinite(r.ttft)]
    itl = [x for r in ok for x in r.itl]
    md5s = {r.index: md5(r.text) for r in ok}
    errors = [f"#{r.index}: {r.error}" for r in results if not r.ok]
    errors += [f"#{r.index}: {r.n_out} tokens, wanted {gen}" for r in ok if r.n_out != gen]
    return {
        "requests": len(results), "completed": len(complete), "errors": errors,
        "duration_s": duration,
        "req_per_s": len(ok) / duration if duration > 0 else math.nan,
        "tok_per_s": n_out / duration if duration > 0 else math.nan,
        "output_tokens": n_out,
        "prompt_tokens_mean": float(np.mean([r.n_prompt for r in ok])) if ok else math.nan,
        "ttft_ms": pct([r.ttft for r in ok if math.isfinite(r.ttft)]),
        "tpot_ms": pct(tpot), "itl_ms": pct(itl),
        "md5": {str(k): v for k, v in sorted(md5s.items())},
        "md5_all": md5("".join(v for _, v in sorted(md5s.items()))),
    }
