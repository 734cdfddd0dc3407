"""The workloads of scripts/bench_cache.py and the client that drives them.

Every workload is a set of conversations (a preamble, then user turns; each
turn's prompt is the whole history so far, answers included, sent to
/completion with cache_prompt true) and an order in which clients take the
turns. A turn waits for its conversation's previous turn; otherwise up to
``clients`` requests are in flight.

  chat     N conversations behind one shared ~350-token system prompt, T
           turns each, turn-major order (so with more conversations than
           slots a conversation's next turn finds its slot holding another);
  prefix   G groups, each a ~1,000-token document with Q questions, in a
           seeded shuffled order (SGLang's generated-shared-prefix shape);
  docs     the RAG shape through /v1/chat/completions (bench_cache sends it
           with scripts/_fleet.py's chat wire): 6 documents of ~1,700 tokens,
           each the system message of 8 single-question chats, shuffled;
  agents   two agents with a shared tool preamble and a unique call-sign
           marker each, alternating on one slot (llama.cpp issue 27148):
           an answer naming the other agent's marker, or a request said to
           reuse more tokens than it shares with anything sent before, is
           cross-talk;
  unique   prompts distinct from their first word: nothing to reuse.

The floor: the tokens of a prompt that no earlier prompt (or prompt plus
its answer) starts with, at least 1, counted with the model's tokenizer
(the one behind /tokenize): what a perfect cache would still evaluate.
"""
from __future__ import annotations

import math
import queue
import random
import threading
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

import loadgen

WORDS = ("time year people way day man thing woman life child world school state family student group country "
         "problem hand part place case week company system program question work government number night point "
         "home water room mother area money story fact month lot right study book eye job word business issue "
         "side kind head house service friend father power hour game line end member law car city community name "
         "president team minute idea kid body information back parent face others level office door health person "
         "art war history party result change morning reason research girl guy moment air teacher force education "
         "river garden harbour forest village castle island bridge market lighthouse keeper storm winter summer "
         "light stone paper letter window road field music table evening answer voice mountain").split()


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


@dataclass
class Conv:
    """One conversation: its preamble and user turns; answers fill in."""

    preamble: str
    users: list[str]
    answers: list[str] = field(default_factory=list)
    marker: str = ""

    def prompt(self, t: int) -> str:
        hist = "".join(f"User: {u}\nAssistant:{a}\n" for u, a in zip(self.users[:t], self.answers[:t]))
        return f"{self.preamble}\n{hist}User: {self.users[t]}\nAssistant:"


@dataclass
class Workload:
    name: str
    title: str
    convs: list[Conv]
    order: list[tuple[int, int]]  # (conversation, turn) in the order clients take them
    clients: int
    slots: int
    n_predict: int
    turn_of: dict[tuple[int, int], int] | None = None  # the reported "turn index" (default: the turn)


def documents(rng: random.Random, g: int, q: int, plen: int, head: str):
    """g documents of plen words, q one-question conversations each, in a
    shuffled order; turn_of: the k-th question of its document to be sent."""
    convs, order = [], []
    for gi in range(g):
        doc = head.format(gi) + words(rng, plen)
        for qi in range(q):
            convs.append(Conv(doc, [f"Question {qi} about document {gi}: {words(rng, 10)}?"]))
            order.append((len(convs) - 1, 0))
    rng.shuffle(order)
    seen: dict[int, int] = {}
    turn_of = {}
    for c, t in order:
        gi = c // q
        turn_of[(c, t)] = seen.get(gi, 0)
        seen[gi] = seen.get(gi, 0) + 1
    return convs, order, turn_of


def sizes(args) -> dict:
    """The workload sizes ``build`` reads, from a bench's arguments (those it has)."""
    keys = ("chat_convs", "chat_turns", "chat_shuffle", "prefix_groups", "prefix_questions", "unique_prompts")
    return {k: getattr(args, k) for k in keys if hasattr(args, k)}


def build(name: str, quick: bool, seed: int, sizes: dict) -> Workload:
    """One workload by name: chat (sizes chat_convs x chat_turns; chat_shuffle:
    each turn's conversations shuffled), chat64,
    prefix (sizes prefix_groups x prefix_questions, default 8 x 16), agents,
    unique (sizes unique_prompts, default 32)."""
    rng = random.Random(f"{seed}-{name}")
    if name in ("chat", "chat64"):
        n, turns = (sizes["chat_convs"], sizes["chat_turns"]) if name == "chat" else (64, 6)
        if quick:
            n, turns = 4, 2
        system = "System: you are a helpful assistant. " + words(rng, 20 if quick else 340)
        convs = [Conv(system, [f"Conversation {c} turn {t}: {words(rng, 12)}?" for t in range(turns)])
                 for c in range(n)]
        order = [(c, t) for t in range(turns) for c in range(n)]
        if sizes.get("chat_shuffle"):  # each turn's conversations in a seeded random order (arrivals a balancer cannot align with)
            o = random.Random(f"{seed}-{name}-order")
            order = [(c, t) for t in range(turns) for c in o.sample(range(n), n)]
        slots = 2 if quick else 4
        return Workload(name, f"{n} conversations x {turns} turns, shared system prompt", convs, order, slots,
                        slots, 4 if quick else 24)
    if name == "prefix":
        g, q, plen = (2, 2, 60) if quick else (sizes.get("prefix_groups", 8), sizes.get("prefix_questions", 16), 995)
        convs, order, turn_of = documents(rng, g, q, plen, "Document {}: ")
        slots = 2 if quick else 4
        return Workload(name, f"{g} groups x {q} questions, ~{plen}-word (~1,000-token) shared document", convs, order, slots,
                        slots, 4 if quick else 16, turn_of)
    if name == "docs":
        g, q, plen = (2, 2, 60) if quick else (6, 8, 1690)
        convs, order, turn_of = documents(rng, g, q, plen, "Document {}. ")
        slots = 2 if quick else 4
        return Workload(name, f"{g} documents x {q} questions over /v1/chat/completions, the document the system "
                              f"message (~{plen} words)", convs, order, slots, slots, 4 if quick else 16, turn_of)
    if name == "agents":
        turns = 2 if quick else 8
        tools = "Tools: " + words(rng, 40 if quick else 600)
        convs = []
        for a in ("A", "B"):
            mark = f"ZX{rng.randrange(10**6):06d}{a}"
            convs.append(Conv(f"{tools}\nYou are agent {a}. Your call sign is {mark}. Sign every reply with {mark}.",
                              [f"Step {t} for agent {a}: {words(rng, 14)}." for t in range(turns)], marker=mark))
        order = [(c, t) for t in range(turns) for c in range(2)]
        return Workload(name, f"2 agents x {turns} turns alternating on one slot", convs, order, 1, 1,
                        4 if quick else 24)
    if name == "unique":
        n, plen = (4, 30) if quick else (sizes.get("unique_prompts", 32), 280)
        convs = [Conv(f"{WORDS[(7 * i) % len(WORDS)].capitalize()} {i}: " + words(rng, plen),
                      [f"Summarise text {i}."]) for i in range(n)]
        slots = 2 if quick else 4
        return Workload(name, f"{n} unique ~{plen}-word prompts, no reuse", convs, [(c, 0) for c in range(n)],
                        slots, slots, 4 if quick else 32)
    raise ValueError(f"unknown workload {name}")


@dataclass
class Wire:
    """How run() sends a turn and reads its stream: ``api`` (loadgen's
    adapter), ``payload(conv, t)`` (what ``api.body`` gets: the prompt text,
    or chat messages), ``text(conv, t, answer)`` (the prompt as the server
    tokenizes it, for the floor; with ``answer``, the prompt followed by that
    answer as the next turn's prompt would start), ``upstream(headers)``
    (which instance answered, when a gateway says so); ``special``: the
    text holds special tokens as text (a chat template's turn markers)."""

    api: loadgen.Api
    payload: Callable[[Conv, int], object]
    text: Callable[[Conv, int, str | None], str]
    upstream: Callable[[dict], str] = lambda _h: ""
    special: bool = False


def native_wire(w: Workload, samp: dict) -> Wire:
    """/completion with the conversation's text, cache_prompt true, greedy, ignore_eos."""

    def body(prompt: str, i: int) -> dict:
        return {"prompt": prompt, "n_predict": w.n_predict, "stream": True, "cache_prompt": True,
                "ignore_eos": True, "seed": 42, **samp}

    def parse(obj: dict):
        if obj.get("stop"):
            return False, obj.get("content", ""), {"n_out": obj.get("tokens_predicted"),
                                                   "n_prompt": obj.get("tokens_evaluated", 0),
                                                   "timings": obj.get("timings") or {}}
        return True, obj.get("content", ""), None

    return Wire(loadgen.Api("/completion", body, parse), lambda c, t: c.prompt(t),
                lambda c, t, answer: c.prompt(t) + (answer or ""))


def lcp(a: np.ndarray, b: np.ndarray) -> int:
    m = min(len(a), len(b))
    d = np.flatnonzero(a[:m] != b[:m])
    return int(d[0]) if len(d) else m


class Tokens:
    """The model's tokenizer (engine/vocab.py, as /tokenize) behind a lock,
    and every sequence sent so far, for the floor."""

    def __init__(self, model: str):
        import logging

        from engine.vocab import Vocab, init_backend

        init_backend(forward=logging.ERROR)
        self.v = Vocab.load(model)
        self.lock = threading.Lock()

    def close(self) -> None:
        self.v.close()

    def ids(self, text: str, special: bool = False) -> np.ndarray:
        with self.lock:
            return np.asarray(self.v.tokenize(text, True, special), np.int32)


def run(port: int, w: Workload, tok: Tokens, timeout: float, samp: dict, on_done=None,
        wire: Wire | None = None, seen: list | None = None) -> tuple[list[dict], float]:
    """Drive one workload against the server on ``port`` (``wire``: how;
    default /completion); one record per request (turn index, TTFT,
    prompt_n/cache_n, tokens, floor, shared, foreign markers, upstream) and
    the wall time (first send -> last answer).
    ``shared``: the longest prefix of the prompt any prompt or answer sent
    or received before it was sent (the floor's measure); ``shared_end``:
    the same over everything received until it ended (another request's
    answer that arrived while this one queued is legitimately reusable), the
    most a correct server can report as cache_n. ``seen``: what this
    server was sent before (a list run() extends: several workloads on one
    server start); default: a fresh server, nothing."""
    wire = wire or native_wire(w, samp)
    done = {(c, t): threading.Event() for c, t in w.order}
    seen = [] if seen is None else seen  # every prompt, and prompt + answer, sent so far
    seen_lock = threading.Lock()
    jobs: queue.Queue = queue.Queue()
    for j in w.order:
        jobs.put(j)
    for _ in range(w.clients):
        jobs.put(None)
    out: list[dict] = []

    def client() -> None:
        while (j := jobs.get()) is not None:
            c, t = j
            if t > 0 and not done[(c, t - 1)].wait(timeout):
                out.append({"conv": c, "turn": t, "ok": False, "error": "previous turn never ended"})
                continue
            conv = w.convs[c]
            ids = tok.ids(wire.text(conv, t, None), wire.special)
            with seen_lock:
                shared = max((lcp(ids, s) for s in seen), default=0)
                seen.append(ids)
            r = loadgen.stream_one(port, wire.api, wire.payload(conv, t), len(out), timeout)
            conv.answers.append(r.text if r.ok else "")
            tim = (r.final or {}).get("timings") or {}
            rec = {"conv": c, "turn": (w.turn_of or {}).get(j, t), "ok": r.ok, "error": r.error,
                   "ttft": r.ttft, "t_send": r.t_send, "t_end": r.t_send + r.latency, "n_out": r.n_out,
                   "itl": r.itl,
                   "n_tokens": len(ids), "shared": shared, "floor": max(len(ids) - shared, 1),
                   "prompt_n": int(tim.get("prompt_n", -1)), "cache_n": int(tim.get("cache_n", -1)),
                   "prompt_ms": float(tim.get("prompt_ms", -1.0)),
                   "foreign": [o.marker for o in w.convs if o.marker and o is not conv and o.marker in r.text],
                   "upstream": wire.upstream(r.headers)}
            with seen_lock:  # what the server could have cached before this request ended: an upper bound
                rec["shared_end"] = max((lcp(ids, s) for s in seen if s is not ids), default=0)
            if r.ok:
                full = tok.ids(wire.text(conv, t, r.text), wire.special)
                with seen_lock:
                    seen.append(full)
            out.append(rec)
            done[j].set()
            if on_done is not None:
                on_done(rec)

    ths = [threading.Thread(target=client, daemon=True) for _ in range(w.clients)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    ok = [r for r in out if r["ok"]]
    wall = (max(r["t_end"] for r in ok) - min(r["t_send"] for r in ok)) if ok else math.nan
    return out, wall
