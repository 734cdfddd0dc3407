"""Model + sampling against llama.cpp itself (real model, ~20 s).

* greedy decoding through Model/Greedy equals llama_cpp.Llama token for token;
* the top-k fast path keeps the same candidates with the same probabilities
  as a llama.cpp chain (top_k, top_p, min_p, temp, dist) applied to the same
  logits, and with the same seed draws the same tokens;
* grammar, logit bias, ignore_eos, n_probs; sample() cost per path.
"""
from __future__ import annotations

import ctypes
import itertools
import math
import time

import numpy as np
import pytest

import llama_cpp as L

from engine.sampling.chain import GrammarDeadEnd
from engine.config import Config
from engine.model import Model
from engine.sampling import make_sampler
from engine.vocab import Vocab

CTX, NB, THREADS = 512, 512, 2
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "<start_of_turn>user\nWrite a haiku about the sea.<end_of_turn>\n<start_of_turn>model\n",
]
BASE = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=7)


@pytest.fixture(scope="module")
def model():
    m = Model(Config(ctx_size=CTX, parallel=1, threads=THREADS, flash_attn="off", batch_size=NB, ubatch_size=NB))
    yield m
    m.close()


def generate(m: Model, prompt: str | list[int], sampler, n: int) -> list[int]:
    """Single-sequence decode loop on slot 0 (what engine/loop.py does per slot)."""
    toks = m.tokenize(prompt) if isinstance(prompt, str) else prompt
    m.seq_clear(0)
    m.clear()
    i = m.add_many(toks, 0, 0, True)
    assert m.decode() == 0
    out, pos = [], len(toks)
    for _ in range(n):
        t = sampler.sample(m, i)
        sampler.accept(t)
        if m.is_eog(t):
            break
        out.append(t)
        m.clear()
        i = m.add(t, pos, 0, True)
        pos += 1
        assert m.decode() == 0
    return out


def test_greedy_matches_llama(model):
    llm = L.Llama(model.cfg.model_path(), n_ctx=CTX, n_batch=NB, n_ubatch=NB, n_threads=THREADS,
                  n_threads_batch=THREADS, flash_attn=False, swa_full=True, verbose=False)
    try:
        for prompt in PROMPTS:
            s = make_sampler(model, dict(BASE, temperature=0.0))
            assert s.kind == "greedy"
            ours = generate(model, prompt, s, 16)
            ref = llm.create_completion(prompt, max_tokens=16, temperature=0.0)["choices"][0]["text"]
            assert model.detokenize(ours).decode("utf-8", "replace") == ref, prompt
            toks = model.tokenize(prompt)
            theirs = []
            for t in itertools.islice(llm.generate(toks, temp=0.0, reset=True), 16):
                if llm.token_eos() == t or model.is_eog(t):
                    break
                theirs.append(t)
            assert ours == theirs, prompt
    finally:
        llm.close()


def llama_chain(p: dict):
    """The chain common/sampling.cpp builds for these params (no-ops left out)."""
    c = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    for s in (L.llama_sampler_init_top_k(p["top_k"]), L.llama_sampler_init_top_p(p["top_p"], 0),
              L.llama_sampler_init_min_p(p["min_p"], 0), L.llama_sampler_init_temp(p["temperature"]),
              L.llama_sampler_init_dist(p["seed"])):
        L.llama_sampler_chain_add(c, s)
    return c


def apply_chain(chain, logits: np.ndarray) -> tuple[int, dict[int, float]]:
    """(token, {id: p}) after llama_sampler_apply on a candidate array over logits."""
    n = logits.size
    data = np.zeros((n, 3), np.int32)
    data[:, 0] = np.arange(n)
    data[:, 1] = logits.view(np.int32)
    arr = L.llama_token_data_array(data=ctypes.cast(data.ctypes.data, L.llama_token_data_p),
                                   size=n, selected=-1, sorted=False)
    L.llama_sampler_apply(chain, ctypes.byref(arr))
    k = arr.size
    ids, ps = data[:k, 0], data[:k, 2].view(np.float32)
    return int(ids[arr.selected]), dict(zip(ids.tolist(), ps.tolist()))


COMBOS = [
    {}, dict(top_p=0.5), dict(min_p=0.2), dict(top_p=1.0, min_p=0.0), dict(temperature=1.7, top_k=100),
    dict(top_k=2), dict(top_k=256, top_p=0.99, min_p=0.01), dict(temperature=0.3, top_p=0.8, min_p=0.1),
]


def random_logits(rng: np.random.Generator, n: int) -> np.ndarray:
    l = (rng.standard_normal(n) * 2.0).astype(np.float32)
    l[rng.integers(0, n, 30)] += rng.uniform(4, 12, 30).astype(np.float32)  # a head, as real logits have
    return l


@pytest.mark.parametrize("combo", COMBOS, ids=[str(c) or "default" for c in COMBOS])
def test_topk_matches_llama_chain(model, combo):
    rng = np.random.default_rng(len(str(combo)))
    for trial in range(4):
        p = dict(BASE, **combo, seed=1000 + trial, n_probs=300, post_sampling_probs=True)
        ours = make_sampler(model, p)
        assert ours.kind == "topk"
        chain = llama_chain(p)
        try:
            for _ in range(25):
                l = random_logits(rng, model.n_vocab)
                t_ref, kept = apply_chain(chain, l.copy())
                t = ours.pick(l)
                ids, p_ours = ours._post
                assert set(ids.tolist()) == set(kept), "kept candidate sets differ"
                ref = np.array([kept[i] for i in ids.tolist()], np.float32)
                np.testing.assert_allclose(p_ours, ref, rtol=2e-5, atol=1e-7)
                assert t == t_ref, "same seed, same logits: same draw"
        finally:
            L.llama_sampler_free(chain)


def test_chain_path_matches_topk_with_bias(model):
    """Forced onto the llama chain (penalties on but nothing accepted yet), the
    general path draws what the fast path draws, biases and ignore_eos included."""
    rng = np.random.default_rng(3)
    bias = np.array([(17, 9.0), (23, -5.0), (17, 1.0)], dtype=[("id", "<i4"), ("bias", "<f4")])
    p = dict(BASE, ignore_eos=1)
    fast = make_sampler(model, p, bias=bias)
    slow = make_sampler(model, dict(p, repeat_penalty=1.0000002), bias=bias)
    assert (fast.kind, slow.kind) == ("topk", "chain")
    for _ in range(40):
        l = random_logits(rng, model.n_vocab)
        l[1] = l[106] = 50.0  # EOG ids on top: ignore_eos must mask them
        before = l.copy()
        a, b = fast.pick(l), slow.pick(l)
        assert a == b and not model.is_eog(a)
        assert np.array_equal(l, before), "biases must be restored"
    slow.free()


def test_greedy_bias_and_ignore_eos(model):
    l = np.zeros(model.n_vocab, np.float32)
    l[1] = 10.0  # <eos>
    l[5] = 9.0
    assert make_sampler(model, dict(BASE, temperature=0)).pick(l) == 1
    assert make_sampler(model, dict(BASE, temperature=0, ignore_eos=1)).pick(l) == 5
    assert make_sampler(model, dict(BASE, temperature=0), bias=[(77, 20.0)]).pick(l) == 77
    assert l[77] == 0.0 and l[1] == 10.0


def test_grammar(model):
    g = b'root ::= "yes" | "no"'
    for p in (dict(BASE, temperature=0), dict(BASE, seed=3), dict(BASE, temperature=1.5, top_k=0, seed=5)):
        s = make_sampler(model, p, grammar=g)
        assert s.kind == "chain"
        out = generate(model, "Is the sky blue? Answer:", s, 8)
        assert model.detokenize(out) in (b"yes", b"no")
        s.free()


def test_invalid_grammar(model):
    for bad in (b'root ::= "yes', b"root ::= (", b'foo ::= "a"'):
        with pytest.raises(ValueError, match="failed to parse grammar"):
            make_sampler(model, BASE, grammar=bad)


def test_grammar_dead_end_raises_instead_of_aborting(model):
    """No token the grammar allows (none can start it; or only the EOG that
    ignore_eos bans): a GrammarDeadEnd for this request. Unchecked, the chain
    picks a masked token and llama_sampler_accept throws a C++ exception
    through ctypes: std::terminate, the whole engine aborts."""
    for g, p in ((b"root ::= [\\x00]", {}), (b'root ::= "yes"', {"ignore_eos": True})):
        for extra in ({"temperature": 0}, {"seed": 3}):
            s = make_sampler(model, dict(BASE, **extra, **p), grammar=g)
            with pytest.raises(GrammarDeadEnd):
                generate(model, "Is it?", s, 8)
            s.free()


@pytest.mark.parametrize("post", [False, True])
@pytest.mark.parametrize("params", [dict(temperature=0), {}, dict(repeat_penalty=1.1)], ids=["greedy", "topk", "chain"])
def test_n_probs(model, post, params):
    s = make_sampler(model, dict(BASE, **params, n_probs=10, post_sampling_probs=post))
    model.seq_clear(0)
    model.clear()
    i = model.add_many(model.tokenize("Once upon a time"), 0, 0, True)
    assert model.decode() == 0
    t = s.sample(model, i)
    ids, lps, chosen = s.probs()
    assert ids.dtype == np.int32 and lps.dtype == np.float32 and 1 <= len(ids) <= 10
    assert np.all(np.diff(lps) <= 0), "sorted, most likely first"
    assert np.exp(lps.astype(np.float64)).sum() <= 1.0 + 1e-5
    assert chosen <= 1e-6
    if not post:
        assert len(ids) == 10
        l = model.logits(i).astype(np.float64)
        lse = l.max() + math.log(np.exp(l - l.max()).sum())
        np.testing.assert_allclose(lps, l[ids] - lse, atol=1e-4)
        np.testing.assert_allclose(chosen, l[t] - lse, atol=1e-4)
    elif params.get("temperature", 1) == 0:
        assert ids.tolist() == [t] and chosen == 0.0
    s.free()


def test_model_basics(model):
    assert model.n_ctx == CTX and model.n_ctx_slot == CTX and model.swa_full
    assert model.kv_bytes > 0 and model.n_vocab == 262144
    assert model.is_eog(model.eos) and not model.is_eog(model.bos)
    toks = model.tokenize("Hello world")
    assert toks[0] == model.bos and model.detokenize(toks[1:]) == b"Hello world"
    model.seq_clear(0)
    model.clear()
    assert model.add_many(toks, 0, 0, True) == len(toks) - 1
    assert model.decode() == 0 and model.pos_max(0) == len(toks) - 1
    assert model.seq_rm(0, 1, -1) and model.pos_max(0) == 0
    model.seq_clear(0)
    assert model.pos_max(0) == -1
    model.clear()
    model.add(1, 0, 0, True)
    with pytest.raises(IndexError):  # more logits rows than slots would abort libllama
        model.add(2, 1, 0, True)
    model.clear()
    with pytest.raises(IndexError):
        model.logits(5)


def test_vocab_only():
    v = Vocab.load(Config().model_path())
    try:
        assert v.n_vocab == 262144 and v.tokenize("Hello", add_special=False) == [9259]
        assert v.token_to_piece(106, special=True) == b"<end_of_turn>"
        assert v.info()["n_embd"] == 640
    finally:
        v.close()


def test_sample_cost(model):
    """Per-call cost of sample() on 262k logits; the fast paths must be far
    cheaper than the llama chain (numbers printed with -s)."""
    model.seq_clear(0)
    model.clear()
    i = model.add_many(model.tokenize("The quick brown fox"), 0, 0, True)
    assert model.decode() == 0
    cost = {}
    for name, p in [("greedy", dict(BASE, temperature=0)), ("topk", BASE), ("chain", dict(BASE, repeat_penalty=1.1))]:
        s = make_sampler(model, p)
        assert s.kind == name
        n = 50 if name == "chain" else 300
        s.sample(model, i)
        best = math.inf
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(n):
                s.sample(model, i)
            best = min(best, (time.perf_counter() - t0) / n * 1e6)
        cost[name] = best
        s.free()
    print("\nsample() us:", {k: round(v, 1) for k, v in cost.items()})
    assert cost["greedy"] < cost["chain"] / 4 and cost["topk"] < cost["chain"] / 2


def test_top_n_sigma(model):
    """top_n_sigma (a row of ipc/params.py): a tiny n keeps only the best
    logit, so sampling at any temperature is the argmax; off (-1) is free."""
    assert make_sampler(model, dict(BASE, top_n_sigma=-1.0)).kind == "topk"
    s = make_sampler(model, dict(BASE, temperature=1.5, top_n_sigma=1e-4))
    assert s.kind == "chain"
    greedy = generate(model, PROMPTS[0], make_sampler(model, dict(BASE, temperature=0.0)), 8)
    assert generate(model, PROMPTS[0], s, 8) == greedy


def test_min_keep(model):
    """min_keep (a row of ipc/params.py, llama.cpp's min_keep of top_p, min_p
    and typical): min_p 1 keeps only the best token, so sampling is the
    argmax; with min_keep 50 the draw is among 50 and the text leaves the
    argmax's (it was accepted and ignored). It takes the llama chain."""
    hot = dict(BASE, temperature=1.5, top_k=0, min_p=1.0, seed=7)
    greedy = generate(model, PROMPTS[0], make_sampler(model, dict(BASE, temperature=0.0)), 12)
    assert generate(model, PROMPTS[0], make_sampler(model, hot), 12) == greedy
    s = make_sampler(model, dict(hot, min_keep=50))
    assert s.kind == "chain"
    assert generate(model, PROMPTS[0], s, 12) != greedy
    assert make_sampler(model, dict(BASE, min_keep=1)).kind == "topk"  # 1 keeps 1 token, as 0 does


REPEAT = "one two three four five, " * 6 + "one two three"


def test_dry_sees_the_prompt_and_breaks_the_repeat(model):
    """DRY (a row of ipc/params.py, no longer accepted and ignored): at
    temperature 0 the greedy text continues the prompt's loop; DRY, fed the
    prompt as llama-server feeds it (prime), moves off it at once, and draws
    exactly what llama.cpp's own chain (dry, temp 0, dist) fed the same
    tokens draws."""
    greedy = generate(model, REPEAT, make_sampler(model, dict(BASE, temperature=0.0)), 6)
    p = dict(BASE, temperature=0.0, dry_multiplier=2.0, dry_penalty_last_n=256)
    s = make_sampler(model, p)
    assert s.kind == "chain"
    toks = model.tokenize(REPEAT)
    s.prime(toks)
    dry = generate(model, toks, s, 6)
    assert dry[0] != greedy[0], (model.detokenize(greedy), model.detokenize(dry))
    ref = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    brk = (ctypes.c_char_p * 4)(b"\n", b":", b"\"", b"*")
    for x in (L.llama_sampler_init_dry(model.vocab.vocab, 2.0, 1.75, 2, 256, brk, 4),
              L.llama_sampler_init_temp(0.0), L.llama_sampler_init_dist(7)):
        L.llama_sampler_chain_add(ref, x)
    try:
        for t in toks:
            L.llama_sampler_accept(ref, t)
        model.seq_clear(0)
        model.clear()
        i = model.add_many(toks, 0, 0, True)
        assert model.decode() == 0
        assert apply_chain(ref, model.logits(i).copy())[0] == dry[0]
    finally:
        L.llama_sampler_free(ref)
    assert make_sampler(model, dict(p, dry_penalty_last_n=-1)).kind == "greedy"  # -1: off in this llama.cpp


def test_xtc_mirostat_dynatemp_and_a_seed_repeats(model):
    """XTC at probability 1 removes every top choice but the last above the
    threshold, so even at temperature 0 the text leaves the argmax's;
    mirostat 2 and dynamic temperature take the chain; a seed repeats its text."""
    greedy = generate(model, PROMPTS[0], make_sampler(model, dict(BASE, temperature=0.0)), 8)
    xtc = dict(BASE, temperature=0.0, xtc_probability=1.0, xtc_threshold=0.01)
    assert generate(model, PROMPTS[0], make_sampler(model, xtc), 8) != greedy
    assert make_sampler(model, dict(xtc, xtc_threshold=0.6)).kind == "greedy"  # > 0.5: off
    for extra in (dict(mirostat=2, mirostat_tau=3.0), dict(mirostat=1),
                  dict(dynatemp_range=0.8, dynatemp_exponent=2.0)):
        p = dict(BASE, temperature=1.2, **extra)
        s = make_sampler(model, p)
        assert s.kind == "chain", extra
        a = generate(model, PROMPTS[1], s, 12)
        assert generate(model, PROMPTS[1], make_sampler(model, p), 12) == a, extra


def test_the_samplers_order_is_the_requests(model):
    """A request's ``samplers`` (ipc/chain.py's header, first in the grammar
    area): temperature alone at 0 is the argmax whatever top_k says; no stage
    at all samples the raw distribution (dist), which leaves the argmax;
    DRY's own breakers reach llama.cpp."""
    from ipc.chain import BREAKERS, pack
    greedy = generate(model, PROMPTS[0], make_sampler(model, dict(BASE, temperature=0.0)), 8)
    p = dict(BASE, temperature=0.0, top_k=0)
    assert generate(model, PROMPTS[0], make_sampler(model, p, grammar=pack("t", BREAKERS)), 8) == greedy
    s = make_sampler(model, dict(p, seed=3), grammar=pack("", BREAKERS))
    assert s.kind == "chain"
    assert generate(model, PROMPTS[0], s, 8) != greedy
    s = make_sampler(model, dict(BASE, dry_multiplier=1.0, dry_penalty_last_n=64),
                     grammar=pack("edkypmxt", ("five", "\n")) + b'root ::= "a"')
    assert s.kind == "chain" and s.grammar is not None


def test_a_forced_reasoning_token_is_all_mirostat_sees(model):
    """A reasoning budget spent at once (budget 0, the prefill opened the
    thoughts): the forced token is drawn, and a stateful stage (mirostat 2)
    is updated from it alone, as llama.cpp's chain after its budget sampler
    (every other token at -inf) updates it; the next free draw is then the
    one a llama.cpp chain treated the same way draws."""
    from ipc.budget import pack as budget_pack

    start, end, forced = model.tokenize("<think>", False, True), [107], [108]
    p = dict(BASE, temperature=0.8, mirostat=2, mirostat_tau=3.0, seed=11)
    s = make_sampler(model, p, grammar=budget_pack(0, start, end, forced, start))
    ref = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    for x in (L.llama_sampler_init_temp(0.8), L.llama_sampler_init_mirostat_v2(11, 3.0, 0.1)):
        L.llama_sampler_chain_add(ref, x)
    try:
        toks = model.tokenize(PROMPTS[0])
        model.seq_clear(0)
        model.clear()
        i = model.add_many(toks, 0, 0, True)
        assert model.decode() == 0
        assert s.sample(model, i) == forced[0] and s.inner.cur.size == 1  # the chain saw the forced token alone
        one = np.zeros((1, 3), np.int32)
        one[0, 0], one[0, 1] = forced[0], model.logits(i)[forced[0]:forced[0] + 1].view(np.int32)[0]
        arr = L.llama_token_data_array(data=ctypes.cast(one.ctypes.data, L.llama_token_data_p), size=1,
                                       selected=-1, sorted=False)
        L.llama_sampler_apply(ref, ctypes.byref(arr))
        s.accept(forced[0])
        L.llama_sampler_accept(ref, forced[0])
        model.clear()
        i = model.add(forced[0], len(toks), 0, True)
        assert model.decode() == 0
        assert s.sample(model, i) == apply_chain(ref, model.logits(i).copy())[0]
    finally:
        L.llama_sampler_free(ref)
