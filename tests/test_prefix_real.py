"""The prefix cache with the real model: many concurrent conversations on few
slots (the scenario of llama.cpp issue 27148), each carrying a unique marker.

Cross-talk checks: no answer names another conversation's marker, and the
first token's distribution of every turn agrees (top tokens, logprobs within
DRIFT) with a from-scratch run of the same prompt (cache_prompt off): KV
computed in another batch shape differs in the last bits, which can flip a
greedy pick in a flat distribution (so later tokens are not compared), but
KV from a prompt a request does not share moves it by far more. Reuse check: later turns attach their
history (more conversations than slots: from the tree, not from their slot),
and first turns attach the shared system prompt another conversation computed.
"""
from __future__ import annotations

import threading

import pytest

from engine.config import Config
from engine.direct import generate
from engine.process import EngineProcess
from ipc.client import WorkerPort
from ipc.layout import CNT

SYSTEM = ("You are a careful assistant for a shipping company. Every conversation has a private marker word. "
          "Never reveal one conversation's marker in another conversation. Answer briefly and politely.\n")
# Six conversations, two per client thread, on three slots: more conversations than slots, and
# each client's next turn finds its slot taken by another conversation (as with twelve on six
# threads: the same paths, half the requests)
MARKERS = ["walrus", "saffron", "tungsten", "marigold", "obsidian", "pelican"]
CLIENTS = 3
QUESTIONS = ["Repeat the conversation marker word.", "Spell your marker word backwards.",
             "Use your marker word in a sentence."]
GEN = 8
DRIFT = 0.5  # largest logprob change allowed between cached and from-scratch evaluation


@pytest.fixture(scope="module")
def engine():
    cfg = Config(parallel=3, ctx_size=3 * 1024, threads=2, http_threads=8, workers=1, prefix_cache=True)
    with EngineProcess(cfg) as eng:
        yield eng, WorkerPort(eng.arena, 0)


@pytest.fixture(scope="module")
def vocab(gemma_vocab):
    return gemma_vocab  # conftest's one load for the session


def test_concurrent_conversations_no_cross_talk_and_reuse(engine, vocab):
    eng, port = engine
    p = eng.cfg.sampling(temperature=0.0, n_predict=GEN, n_probs=5, ignore_eos=1)
    hist = {m: f"{SYSTEM}Conversation marker: {m}.\n" for m in MARKERS}
    runs: list[tuple[str, int, list[int], object]] = []  # marker, turn, prompt ids, output
    lock = threading.Lock()
    errors: list[BaseException] = []

    def client(markers: list[str]) -> None:
        try:
            for turn, q in enumerate(QUESTIONS):
                for m in markers:  # interleaved: a conversation's next turn finds its slot used by another
                    text = hist[m] + f"User: {q}\nAssistant:"
                    ids = vocab.tokenize(text.encode(), add_bos=True, special=True)
                    out = generate(port, ids, p)
                    with lock:
                        runs.append((m, turn, ids, out))
                    hist[m] = text + vocab.detokenize(out.tokens).decode("utf-8", "replace") + "\n"
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    c0 = eng.arena.counters.copy()
    ths = [threading.Thread(target=client, args=(MARKERS[i::CLIENTS],)) for i in range(CLIENTS)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    assert not errors, errors
    assert len(runs) == len(MARKERS) * len(QUESTIONS)
    d = eng.arena.counters - c0

    # cross-talk 1: no output names another conversation's marker
    for m, turn, ids, out in runs:
        text = vocab.detokenize(out.tokens).decode("utf-8", "replace").lower()
        assert not [x for x in MARKERS if x != m and x in text], (m, turn, text)
    # cross-talk 2: the first token's distribution (the prompt's KV alone decides it) agrees with a
    # from-scratch run of the same prompt; KV computed in other batch shapes moves logprobs by
    # hundredths to tenths (a flat distribution's greedy pick may flip), foreign KV by far more
    cold_p = {**p, "cache_prompt": 0, "n_predict": 1}
    for m, turn, ids, out in runs:
        cold = generate(port, ids, cold_p)
        assert cold.result["n_cache"] == 0
        a, b = dict(out.probs[0].tolist()), dict(cold.probs[0].tolist())
        top_a, top_b = max(a, key=a.get), max(b, key=b.get)
        assert top_b in a and top_a in b, (m, turn, a, b)
        assert abs(a[top_b] - b[top_b]) < DRIFT and abs(a[top_a] - b[top_a]) < DRIFT, (m, turn, a, b)

    # reuse: later turns attach at least their previous turn's prompt
    by = {(m, t): (ids, out) for m, t, ids, out in runs}
    for m in MARKERS:
        for t in (1, 2):
            prev_ids, _ = by[(m, t - 1)]
            ids, out = by[(m, t)]
            assert out.result["n_cache"] >= len(prev_ids), (m, t, out.result["n_cache"], len(prev_ids))
            assert out.result["n_cache"] + out.result["n_eval"] == len(ids)
    sys_len = len(vocab.tokenize(SYSTEM.encode(), add_bos=True, special=True))
    first_reused = [by[(m, 0)][1].result["n_cache"] for m in MARKERS]
    assert sum(n >= sys_len - 2 for n in first_reused) >= len(MARKERS) - 3, first_reused
    assert d[CNT["cache_hits_total"]] >= 2 * len(MARKERS)
    assert d[CNT["cache_tokens_reused_total"]] == d[CNT["prompt_tokens_cached_total"]]
    assert eng.arena.counters[CNT["cache_tokens_held"]] > 0


def test_id_slot_pinning_uses_the_cache(engine, vocab):
    """A request pinned to a slot attaches a prefix cached from another slot."""
    eng, port = engine
    ids = vocab.tokenize((SYSTEM + "User: Pinned request about the weather.\nAssistant:").encode(),
                         add_bos=True, special=True)
    p = eng.cfg.sampling(temperature=0.0, n_predict=4)
    a = generate(port, ids, {**p, "id_slot": 0})
    b = generate(port, ids, {**p, "id_slot": 2})
    assert a.result["id_slot"] == 0 and b.result["id_slot"] == 2
    assert b.result["n_cache"] == len(ids) - 1 and b.tokens == a.tokens


def test_ram_tier_restores_past_the_sliding_window(engine, vocab):
    """Gemma 3 (n_swa 512): a prefix longer than the window comes back from
    host RAM exactly, at the blob's end, which moved down to where another
    prompt branched off (or a line start a few tokens below it); the first token's distribution agrees with a
    from-scratch run and /metrics counts the saves and loads."""
    eng, port = engine
    doc = vocab.tokenize(("Report. " + " ".join(f"Item {i} ships on day {i % 7}." for i in range(64))).encode(),
                         add_bos=True, special=True)
    assert 600 < len(doc) < 900

    def ask(q: str) -> list[int]:
        return doc + vocab.tokenize(f"\nQuestion: {q}\nAnswer:".encode(), add_bos=False, special=True)

    p = eng.cfg.sampling(temperature=0.0, n_predict=4, n_probs=5, ignore_eos=1)
    c0 = eng.arena.counters.copy()
    a = generate(port, ask("Which item ships first?"), {**p, "id_slot": 1})
    b = generate(port, ask("Which day is busiest?"), {**p, "id_slot": 1})  # own prefix: a goes to RAM
    assert b.result["n_cache"] >= len(doc), b.result
    other = vocab.tokenize(("Unrelated. " + "Cats sleep a lot. " * 15).encode(), add_bos=True, special=True)
    generate(port, other, {**p, "id_slot": 1})  # b goes to RAM, with the window where it branched off a
    q = ask("Which items ship on day 3?")
    d = generate(port, q, {**p, "id_slot": 1})
    shared = b.result["n_cache"]
    # where b branched off a ("...\nQuestion: Which"), or the question's line start a few tokens below it:
    # one blob ending there serves both, no 7.9 MB checkpoint for 3 tokens (engine/keep.py _to_ram)
    assert len(doc) <= d.result["n_cache"] <= shared and shared - d.result["n_cache"] <= 4, (d.result, shared)
    cold = generate(port, q, {**p, "cache_prompt": 0, "n_predict": 1})
    x, y = dict(d.probs[0].tolist()), dict(cold.probs[0].tolist())
    top = max(y, key=y.get)
    assert top in x and abs(x[top] - y[top]) < DRIFT, (x, y)
    diff = eng.arena.counters - c0
    assert diff[CNT["cache_ram_saves_total"]] >= 2 and diff[CNT["cache_ram_loads_total"]] >= 1
    assert eng.arena.counters[CNT["cache_ram_bytes"]] > 0
    assert a.result["n_cache"] < len(doc)  # nothing of the report was cached before


def test_parking_stream_serves_any_prefix_past_the_window(vocab):
    """--cache-streams 1, one slot: a long content evicted by another prompt
    is parked whole, so a later prompt branching off it inside (no RAM
    checkpoint there) still reuses everything it shares."""
    cfg = Config(parallel=1, ctx_size=1024, threads=2, http_threads=4, workers=1, cache_streams=1)
    doc = vocab.tokenize(("Log. " + " ".join(f"Unit {i} reported state {i % 5}." for i in range(70))).encode(),
                         add_bos=True, special=True)
    assert 600 < len(doc) < 900
    with EngineProcess(cfg) as eng:
        port = WorkerPort(eng.arena, 0)
        p = cfg.sampling(temperature=0.0, n_predict=4, n_probs=5, ignore_eos=1)
        tail = vocab.tokenize(b"\nSummary:", add_bos=False, special=True)
        generate(port, doc + tail, p)
        generate(port, vocab.tokenize(("Other. " + "Birds sing. " * 15).encode(), add_bos=True, special=True), p)
        q = doc[:len(doc) - 40] + vocab.tokenize(b" Unit 99 failed.\nSummary:", add_bos=False, special=True)
        d = generate(port, q, p)
        assert d.result["n_cache"] == len(doc) - 40, d.result
        cold = generate(port, q, {**p, "cache_prompt": 0, "n_predict": 1})
        x, y = dict(d.probs[0].tolist()), dict(cold.probs[0].tolist())
        top = max(y, key=y.get)
        assert top in x and abs(x[top] - y[top]) < DRIFT, (x, y)
        assert eng.arena.counters[CNT["cache_parks_total"]] >= 1


def test_a_documents_second_question_reuses_it_after_its_slot_moved_on(engine, vocab):
    """Issue 24: the first question's content goes to RAM with a checkpoint
    of the window where its prompt's last turn starts (the document's end),
    so the second question, arriving after another prompt took the slot,
    evaluates its own turn only, exactly (first token's distribution as from
    scratch)."""
    eng, port = engine
    doc = vocab.tokenize(("Manual. " + " ".join(f"Valve {i} opens at {i % 9} bar." for i in range(70))).encode(),
                         add_bos=True, special=True)
    assert 600 < len(doc) < 900

    def ask(q: str) -> list[int]:
        return doc + vocab.tokenize(f"\nQuestion: {q}\nAnswer:".encode(), add_bos=False, special=True)

    p = eng.cfg.sampling(temperature=0.0, n_predict=4, n_probs=5, ignore_eos=1)
    generate(port, ask("Which valve opens at the lowest pressure?"), {**p, "id_slot": 2})
    other = vocab.tokenize(("Unrelated. " + "Dogs bark at night. " * 15).encode(), add_bos=True, special=True)
    generate(port, other, {**p, "id_slot": 2})  # the first question's content goes to RAM
    q = ask("How many valves are listed?")
    c0 = eng.arena.counters.copy()
    d = generate(port, q, {**p, "id_slot": 2})
    assert len(doc) <= d.result["n_cache"] <= len(doc) + 2, (d.result["n_cache"], len(doc))
    assert (eng.arena.counters - c0)[CNT["cache_ram_loads_total"]] == 1
    cold = generate(port, q, {**p, "cache_prompt": 0, "n_predict": 1})
    x, y = dict(d.probs[0].tolist()), dict(cold.probs[0].tolist())
    top = max(y, key=y.get)
    assert top in x and abs(x[top] - y[top]) < DRIFT, (x, y)


def test_without_a_sliding_window_any_prefix_of_a_ram_entry_is_usable(vocab):
    """SmolLM2 (llama, no sliding window): a blob serves every prefix of its
    content, no checkpoint needed: a prompt branching off an evicted content
    anywhere inside reuses all it shares, and answers as from scratch."""
    from frontends import testing

    model = testing.models.smollm2()
    cfg = Config(model=model, parallel=1, ctx_size=1024, threads=2, http_threads=4, workers=1)
    with EngineProcess(cfg) as eng:
        port = WorkerPort(eng.arena, 0)
        from llama_cpp import Llama

        v = Llama(model, vocab_only=True, verbose=False)
        try:
            # no window to outgrow: any length shows it (the Gemma tests need 600+ tokens, this not)
            doc = v.tokenize(("Log. " + " ".join(f"Unit {i} reported state {i % 5}." for i in range(35))).encode(),
                             add_bos=True, special=True)
            p = cfg.sampling(temperature=0.0, n_predict=4, n_probs=5, ignore_eos=1)
            generate(port, doc + v.tokenize(b"\nSummary:", add_bos=False, special=True), p)
            generate(port, v.tokenize(("Other. " + "Birds sing. " * 15).encode(), add_bos=True, special=True), p)
            for cut in (len(doc) - 40, len(doc) // 3):
                q = doc[:cut] + v.tokenize(b" Unit 99 failed.\nSummary:", add_bos=False, special=True)
                d = generate(port, q, p)
                assert d.result["n_cache"] >= cut, (cut, d.result["n_cache"])
                cold = generate(port, q, {**p, "cache_prompt": 0, "n_predict": 1})
                x, y = dict(d.probs[0].tolist()), dict(cold.probs[0].tolist())
                top = max(y, key=y.get)
                assert top in x and abs(x[top] - y[top]) < DRIFT, (x, y)
            assert eng.arena.counters[CNT["cache_ram_loads_total"]] >= 1
        finally:
            v.close()


def test_a_dropped_stream_keeps_its_prompt_in_the_slot_and_nothing_in_ram(engine, vocab):
    """Issue 24: a stream its client abandons keeps only its prompt in its
    slot (a retry still finds it) and never reaches the RAM tier; a request
    stopped at a stop string (Lease.cancel(whole=True)) is kept whole."""
    import time

    eng, port = engine
    ids = vocab.tokenize(("A unique tale of the violet crane 4417 in the old harbour. " * 4).encode(),
                         add_bos=True, special=True)
    p = eng.cfg.sampling(temperature=0.0, n_predict=200, ignore_eos=1)
    generate(port, ids, {**p, "id_slot": 0}, cancel_after=6)
    deadline = time.monotonic() + 10
    while eng.arena.slots[0]["state"] != 0 and time.monotonic() < deadline:  # the engine ends it
        time.sleep(0.02)
    assert eng.arena.slots[0]["n_past"] == len(ids), eng.arena.slots[0]
    again = generate(port, ids, {**p, "id_slot": 0, "n_predict": 2})
    assert again.result["n_cache"] == len(ids) - 1
    c0 = eng.arena.counters.copy()
    generate(port, ids, {**p, "id_slot": 0}, cancel_after=6)
    time.sleep(0.3)
    other = vocab.tokenize(("Cranes lift boxes all day long. " * 20).encode(), add_bos=True, special=True)
    generate(port, other, {**p, "id_slot": 0, "n_predict": 2})
    d = eng.arena.counters - c0
    assert d[CNT["cache_ram_saves_total"]] == 0  # the abandoned content went nowhere
