"""A fake engine for frontend tests: the real ipc protocol, no model.

``python -m frontends.testing.fake_engine --arena INSTANCE`` (or ``Fake`` in
a thread of the test process: testing.TestClient) attaches to the arena,
takes an ``EnginePort``, publishes model facts and READY, and answers each
submission by echoing its prompt (without the leading BOS) one token per
record, cyclically, every FAKE_TOKEN_S seconds:

* ``n_predict`` N >= 0: exactly N tokens, then STOP_LIMIT on the last one;
* ``n_predict`` -1: one pass over the prompt, then EOS (token 1, counted);
* the slot's context full: STOP_CTX;
* ``seed`` 999999: STOP_ERROR with code 400 (a sampler-init failure);
* cancel (flag or SUB_CANCEL): a LAST record with STOP_CANCEL;
* SIGTERM: every active request ends with STOP_SHUTDOWN, then exit;
* ``Fake.embd`` N > 0 (in-process only): each request gets an N-float vector
  (prompt length, sum of ids mod 997, zeros), as engine/embed.py answers;
* ``Fake.gap`` (N, S) (env FAKE_GAP="N:S"): S seconds of silence after a
  request's N-th token (N 0: before the first, a long prompt's evaluation),
  what SSE pings are for (frontends/http/gen.py).

Env: FAKE_LOAD_S (time in LOADING), FAKE_TOKEN_S, FAKE_ENGINE_LOG (a file:
one line per event, "submit|cancel|erase <rid|slot> <CLOCK_MONOTONIC ns>"),
FAKE_CRASH_ONCE (a path: the first engine that finds no file there makes one
and dies right after READY, before its supervisor's next poll: of SIGKILL,
or with FAKE_CRASH_HOW=exit as engine/run.py ends on an exception, state
DOWN and exit 1).
It exits when its parent dies, as the real engine does.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections import deque

import numpy as np

from engine.config import Config
from ipc.arena import Arena
from ipc.channel import BadRequest
from ipc.layout import (
    CNT, F_FIRST, F_LAST, F_PROGRESS, RESULT, SLOT_GEN, SLOT_IDLE, ST_DOWN, ST_STOPPING, STOP_CANCEL, STOP_CTX, STOP_EOS,
    STOP_ERROR, STOP_LIMIT, STOP_SHIFT, STOP_SHUTDOWN, SUB_CANCEL, SUB_ERASE, SUB_RESTORE, SUB_SAVE, SUB_SUBMIT,
)
from ipc.server import EnginePort

N_VOCAB = 262144
EOS = 1


class Job:
    def __init__(self, ch: int, rid: int, prompt: np.ndarray, params: dict, task: int):
        self.ch, self.rid, self.params, self.task = ch, rid, params, task
        self.prompt = prompt.tolist()
        body = self.prompt[1:] if len(self.prompt) > 1 and self.prompt[0] == 2 else self.prompt
        self.out = body or [EOS]
        self.n = 0
        self.slot = -1
        self.t0 = time.monotonic()
        self.next_t = 0.0
        self.n_cache = 0


class Fake:
    def __init__(self, arena: Arena, delay: float, logf):
        self.a, self.delay, self.logf = arena, delay, logf
        self.port = EnginePort(arena, self.reclaim)
        self.slots: list[Job | None] = [None] * arena.geom.n_slots
        self.cached: list[list[int]] = [[] for _ in self.slots]
        self.queue: deque[Job] = deque()
        self.n_ctx_slot = arena.geom.max_prompt
        self.stop = False
        self.tasks = 0
        self.embd = 0  # > 0: answer every request with a vector of this many floats (engine/embed.py's protocol)
        self.gap: tuple[int, float] = (0, 0.0)  # (n, s): s seconds of silence after each request's n-th token

    def ready(self, cfg: Config) -> None:
        """Publish the model facts a real engine would, then READY."""
        self.a.set("n_ctx", cfg.ctx_size or 4096)
        self.a.set("n_ctx_slot", self.a.geom.max_prompt)
        self.a.set("n_vocab", N_VOCAB)
        self.a.set("n_ctx_train", 32768)
        self.port.ready()

    def log(self, what: str, arg: int) -> None:
        if self.logf:
            self.logf.write(f"{what} {arg} {time.monotonic_ns()}\n")
            self.logf.flush()

    def count(self, name: str, v: float = 1.0) -> None:
        self.a.counters[CNT[name]] += v

    def reclaim(self, w: int, chans: range) -> None:
        for i, j in enumerate(self.slots):
            if j is not None and j.ch in chans:
                self.release(j)
        self.queue = deque(j for j in self.queue if j.ch not in chans)

    # ------------------------------------------------------------------ jobs
    def submit(self, ch: int, rid: int) -> None:
        try:
            prompt, params, _g, _b = self.a.channel(ch).read_request(N_VOCAB)
        except BadRequest as e:
            self.finish_raw(ch, rid, STOP_ERROR, 400, str(e))
            return
        self.tasks += 1
        self.queue.append(Job(ch, rid, prompt, params, self.tasks))
        self.count("requests_total")
        self.log("submit", rid)

    def assign(self) -> None:
        for j in list(self.queue):
            want = j.params["id_slot"]
            free = [s for s, x in enumerate(self.slots) if x is None]
            s = want if want in free else (free[0] if free and want < 0 else None)
            if s is None:
                continue
            self.queue.remove(j)
            j.slot = s
            self.slots[s] = j
            if j.params["cache_prompt"]:
                old = self.cached[s]
                k = 0
                while k < min(len(old), len(j.prompt) - 1) and old[k] == j.prompt[k]:
                    k += 1
                j.n_cache = k
            self.cached[s] = list(j.prompt)
            j.next_t = time.monotonic() + self.delay + (self.gap[1] if self.gap[0] == 0 else 0.0)
            if j.params.get("return_progress"):  # the engine's records: started, then the whole prompt
                c, t = self.a.channel(j.ch), time.monotonic_ns()
                c.push(j.rid, t, j.n_cache, F_PROGRESS, 0.0)
                c.push(j.rid, t, len(j.prompt), F_PROGRESS, 1.0)
            self.count("prompt_tokens_total", len(j.prompt) - j.n_cache)
            self.count("prompt_tokens_cached_total", j.n_cache)
            self.count("prompt_seconds_total", 0.001)

    def finish_raw(self, ch: int, rid: int, stop: int, code: int = 0, msg: str = "") -> None:
        c = self.a.channel(ch)
        r = np.zeros(1, RESULT)
        r["error_code"], r["error"] = code, msg.encode()[:199]
        c.result[:] = r
        c.push(rid, time.monotonic_ns(), -1, F_LAST | (stop << STOP_SHIFT))

    def finish(self, j: Job, stop: int, token: int = -1, code: int = 0, msg: str = "", n_embd: int = 0) -> bool:
        c = self.a.channel(j.ch)
        r = np.zeros(1, RESULT)
        n_eval = len(j.prompt) - j.n_cache
        r["id_slot"], r["n_prompt"], r["n_cache"], r["n_eval"] = j.slot, len(j.prompt), j.n_cache, n_eval
        r["n_decoded"] = j.n
        r["n_ctx_used"] = len(j.prompt) + j.n
        r["prompt_ms"] = 0.5 * n_eval
        r["predicted_ms"] = (time.monotonic() - j.t0) * 1e3
        r["error_code"], r["error"], r["n_embd"] = code, msg.encode()[:199], n_embd
        c.result[:] = r
        flags = F_LAST | (stop << STOP_SHIFT) | (F_FIRST if j.n == 1 and token >= 0 else 0)
        self.release(j)  # the slot is idle before the reader can see the end (a /slots right after agrees)
        if not c.push(j.rid, time.monotonic_ns(), token, flags, -0.5, self.probs(j, token)):
            self.slots[j.slot] = j  # ring full: still ours, retry next step
            return False
        self.count("tokens_predicted_total", j.n)
        self.count("tokens_predicted_seconds_total", r["predicted_ms"][0] / 1e3)
        self.count("tokens_predicted_steps_total", max(j.n - 1, 0))
        return True

    def release(self, j: Job) -> None:
        if 0 <= j.slot < len(self.slots) and self.slots[j.slot] is j:
            self.slots[j.slot] = None
            row = self.a.slots[j.slot : j.slot + 1]
            row["state"] = SLOT_IDLE
            row["n_decoded"] = j.n
            row["n_past"] = len(j.prompt) + j.n

    def probs(self, j: Job, token: int):
        n = j.params["n_probs"]
        if not n or token < 0:
            return None
        ids = np.array([(token + k) % N_VOCAB for k in range(n)], np.int32)
        return ids, np.array([-0.5 - k for k in range(n)], np.float32)

    def cancel(self, ch: int, rid: int) -> None:
        self.log("cancel", rid)
        self.count("cancels_total")
        for j in list(self.queue):
            if j.ch == ch and j.rid == rid:
                self.queue.remove(j)
                self.finish_raw(ch, rid, STOP_CANCEL)
        for j in self.slots:
            if j is not None and j.ch == ch and j.rid == rid:
                self.finish(j, STOP_CANCEL)

    def step(self, j: Job, now: float) -> None:
        if not self.port.owner_ok(j.ch, j.rid):
            self.cancel(j.ch, j.rid)
            return
        if now < j.next_t:
            return
        p = j.params
        if self.embd:  # vector = (prompt length, sum of its ids mod 997, 0, ...)
            v = self.a.channel(j.ch).vector
            v[:self.embd] = 0
            v[0], v[1] = len(j.prompt), sum(j.prompt) % 997
            self.finish(j, STOP_EOS, n_embd=self.embd)
            return
        if p["seed"] == 999999:
            self.finish(j, STOP_ERROR, -1, 400, "Failed to initialize samplers: fake error")
            return
        if p["n_predict"] == 0:
            self.finish(j, STOP_LIMIT)
            return
        tok = j.out[j.n % len(j.out)]
        if p["n_predict"] < 0 and j.n >= len(j.out):
            tok = EOS
        j.n += 1
        j.next_t = now + self.delay + (self.gap[1] if j.n == self.gap[0] else 0.0)
        row = self.a.slots[j.slot : j.slot + 1]
        row["state"], row["channel"], row["rid"] = SLOT_GEN, j.ch, j.rid
        row["n_prompt"], row["n_cache"], row["n_decoded"] = len(j.prompt), j.n_cache, j.n
        row["n_past"], row["n_predict"], row["id_task"] = len(j.prompt) + j.n, p["n_predict"], j.task
        self.count("n_decode_total")
        self.count("n_busy_slots_total", sum(x is not None for x in self.slots))
        if tok == EOS:
            self.finish(j, STOP_EOS, tok)
        elif 0 <= p["n_predict"] <= j.n:
            self.finish(j, STOP_LIMIT, tok)
        elif len(j.prompt) + j.n + 1 >= self.n_ctx_slot:
            self.finish(j, STOP_CTX, tok)
        else:
            c = self.a.channel(j.ch)
            flags = F_FIRST if j.n == 1 else 0
            if not c.push(j.rid, time.monotonic_ns(), tok, flags, -0.5, self.probs(j, tok)):
                j.n -= 1  # ring full: the reader is slow; retry next step
                self.count("ring_full_pauses_total")
            else:
                self.count("ring_pushes_total")

    def run(self) -> None:
        ppid = os.getppid()
        while not self.stop and os.getppid() == ppid:
            for kind, ch, rid, arg in self.port.poll():
                if kind == SUB_SUBMIT:
                    self.submit(ch, rid)
                elif kind == SUB_CANCEL:
                    self.cancel(ch, rid)
                elif kind == SUB_ERASE:
                    self.log("erase", arg)
                    if 0 <= arg < len(self.cached):
                        self.cached[arg] = []
                        self.a.slots[arg : arg + 1]["n_past"] = 0
                elif kind in (SUB_SAVE, SUB_RESTORE):  # no KV here: a clear answer, never a hang
                    c = self.a.channel(ch)
                    c.result[0] = (arg, 0, 0, 0, 0, 0, 0.0, 0.0, 501, 0, 0, b"slot files need the real engine", 0, 0)
                    c.push(rid, time.monotonic_ns(), -1, F_LAST | STOP_ERROR << STOP_SHIFT)
            self.assign()
            now = time.monotonic()
            for j in list(self.slots):
                if j is not None:
                    self.step(j, now)
            self.a.counters[CNT["requests_deferred"]] = len(self.queue)
            self.a.set("heartbeat_ns", time.monotonic_ns())
            busy = any(x is not None for x in self.slots) or self.queue
            self.port.wait(0.001 if busy else 0.05)
        self.a.set("state", ST_STOPPING)
        for j in list(self.slots):
            if j is not None:
                self.finish(j, STOP_SHUTDOWN)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arena", required=True)
    args = ap.parse_args()
    arena = Arena.attach(args.arena)
    path = os.environ.get("FAKE_ENGINE_LOG")
    logf = open(path, "a") if path else None
    fake = Fake(arena, float(os.environ.get("FAKE_TOKEN_S", "0.002")), logf)
    n, _, sec = os.environ.get("FAKE_GAP", "0:0").partition(":")
    fake.gap = (int(n), float(sec or 0))

    def on_term(*_):
        fake.stop = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    deadline = time.monotonic() + float(os.environ.get("FAKE_LOAD_S", "0"))
    while time.monotonic() < deadline and not fake.stop:
        arena.set("heartbeat_ns", time.monotonic_ns())
        time.sleep(0.02)
    fake.ready(Config.from_env())
    once = os.environ.get("FAKE_CRASH_ONCE")
    if once and not os.path.exists(once):
        open(once, "w").close()
        if os.environ.get("FAKE_CRASH_HOW") == "exit":
            arena.set("state", ST_DOWN)
            os._exit(1)
        os.kill(os.getpid(), signal.SIGKILL)
    fake.run()


if __name__ == "__main__":
    sys.exit(main())


def register_polled(port, engine) -> None:
    """Register ``port`` (a WorkerPort) with an in-process ``engine`` (an
    EnginePort nobody else drives): the registration blocks on the engine's
    ack, so the engine polls meanwhile (one thread, tests and scripts)."""
    t = threading.Thread(target=port.register)
    t.start()
    while t.is_alive():
        engine.poll()
        t.join(0.001)
