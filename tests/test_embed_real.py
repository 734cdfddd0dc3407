"""Embeddings with the real default model (gemma 3 270M) under --embedding
--pooling mean: the official OpenAI client (float and base64), llama-server's
native shapes, every input form, normalisation, the 4xx answers, and the
point of engine/embed.py: a vector computed alone equals the same input's
vector computed while other embedding requests keep every slot busy
(llama-server returns fragments' vectors there, llama.cpp issue 26282).
Rerank: the default model has no rank head, so /rerank is a 501 and
--reranking refuses to start."""
from __future__ import annotations

import threading
from typing import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import openai
import pytest
import requests

from frontends import testing as S
from frontends.testing.server import running

FLAGS = ("-c", "4096", "-np", "4", "-t", "2", "-w", "1", "--threads-http", "16", "--embedding", "--pooling", "mean")
N_EMBD = 640


@pytest.fixture(scope="module")
def srv() -> Iterator[S.Server]:
    with running(*FLAGS) as s:
        yield s


def post(srv, path, body, code=200):
    r = requests.post(srv.url(path), json=body, timeout=120)
    assert r.status_code == code, (path, r.status_code, r.text[:300])
    return r.json()


def tokens(srv, text: str) -> list[int]:
    return post(srv, "/tokenize", {"content": text, "add_special": True})["tokens"]


def test_openai_client(srv):
    c = openai.OpenAI(base_url=srv.url("/v1"), api_key="x", max_retries=0, timeout=120)
    texts = ["The sky is blue.", "Rust is a systems programming language with a borrow checker."]
    r = c.embeddings.create(model="m", input=texts)  # the SDK asks for base64 and decodes it
    f = c.embeddings.create(model="m", input=texts, encoding_format="float")
    assert [d.index for d in r.data] == [0, 1] and r.object == "list" and r.model == "m"
    for d, e in zip(r.data, f.data):
        v = np.array(d.embedding, np.float32)
        assert v.shape == (N_EMBD,) and abs(float(np.linalg.norm(v)) - 1) < 1e-5  # embd_normalize 2
        assert np.array_equal(v, np.array(e.embedding, np.float32))  # base64 carries the same float32s
    n = sum(len(tokens(srv, t)) for t in texts)
    assert r.usage.prompt_tokens == r.usage.total_tokens == n
    a, b = (np.array(d.embedding) for d in r.data)
    assert float(a @ b) < 0.999  # two different texts, two different vectors


def test_native_shapes_and_input_forms(srv):
    text = "hello world"
    native = post(srv, "/embedding", {"content": text})
    assert len(native) == 1 and native[0]["index"] == 0 and len(native[0]["embedding"]) == 1
    v = np.array(native[0]["embedding"][0], np.float32)
    assert post(srv, "/embeddings", {"content": text}) == native
    assert post(srv, "/v1/embeddings", {"content": text}) == native  # "content" is not OAI: native shape
    oai = post(srv, "/v1/embeddings", {"input": [text, tokens(srv, text), [text]]})
    for d in oai["data"]:  # a string, its token ids (with BOS), a mixed array: one input each
        assert np.array_equal(np.array(d["embedding"], np.float32), v)
    raw = np.array(post(srv, "/embedding", {"content": text, "embd_normalize": -1})[0]["embedding"][0])
    assert abs(np.linalg.norm(raw) - 1) > 1e-3
    assert np.allclose(raw / np.linalg.norm(raw), v, atol=1e-6)
    taxicab = np.array(post(srv, "/embedding", {"content": text, "embd_normalize": 1})[0]["embedding"][0])
    assert abs(np.abs(taxicab).sum() - 1) < 1e-4
    int16 = np.array(post(srv, "/embedding", {"content": text, "embd_normalize": 0})[0]["embedding"][0])
    assert abs(np.abs(int16).max() - 32760) < 0.05


def test_vector_alone_equals_vector_under_load(srv):
    """Several slots busy with other inputs of other lengths: the vector of
    one input does not change (exactly: each request is its own decode).
    Each probe request's three inputs hold three slots at once (a wave of
    n_slots leases), and three threads keep submitting batches beside it."""
    probe = "A probe sentence whose vector must not depend on its neighbours."
    alone = np.array(post(srv, "/v1/embeddings", {"input": probe, "encoding_format": "float"})["data"][0]["embedding"])
    others = [" ".join(["word"] * k) for k in (3, 17, 40, 9, 25)]
    stop = threading.Event()

    def noise(i: int) -> int:
        n = 0
        while not stop.is_set():
            d = post(srv, "/v1/embeddings", {"input": others[i % len(others):] + others[:i % len(others)]})
            n += len(d["data"])
        return n

    with ThreadPoolExecutor(3) as ex:
        fut = [ex.submit(noise, i) for i in range(3)]
        got = []
        for _ in range(2):  # each probe the same check under the same load: two, not four
            d = post(srv, "/v1/embeddings", {"input": [others[1], probe, others[3]], "encoding_format": "float"})
            got.append(np.array(d["data"][1]["embedding"]))
        stop.set()
        assert sum(f.result() for f in fut) > 0
    for g in got:
        assert np.allclose(g, alone, rtol=0, atol=1e-6), float(np.abs(g - alone).max())


@pytest.mark.parametrize("path, body, code, words", [
    ("/v1/embeddings", {}, 400, '"input" or "content" must be provided'),
    ("/v1/embeddings", {"input": []}, 400, "must not be empty"),
    ("/v1/embeddings", {"input": [[]]}, 400, "Input content cannot be empty"),  # "" is BOS alone: valid
    ("/v1/embeddings", {"input": True}, 400, "prompt"),  # a bare integer is one token id, as llama-server
    ("/v1/embeddings", {"input": [99999999]}, 400, "out of range"),
    ("/v1/embeddings", {"input": "x", "encoding_format": "hex"}, 400, "float or base64"),
    ("/v1/embeddings", {"input": "x", "embd_normalize": "two"}, 400, "embd_normalize"),
    ("/v1/embeddings", {"input": "word " * 600}, 400, "too large to process"),
    ("/embedding", {"content": {"a": 1}}, 400, "prompt"),
    ("/completion", {"prompt": "hi"}, 501, "does not support completions"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, 501, "does not support completions"),
    ("/rerank", {"query": "a", "documents": ["b"]}, 501, "Start it with `--reranking`"),
])
def test_bad_input(srv, path, body, code, words):
    e = post(srv, path, body, code)["error"]
    assert e["code"] == code and words in e["message"], e
    # nothing else noticed: the next request is answered as before
    assert len(post(srv, "/v1/embeddings", {"input": "still fine"})["data"][0]["embedding"]) == N_EMBD


def test_rerank_needs_a_rank_head():
    """Without --reranking: 501 (checked on a plain server by the fake-engine
    tests too). With it, the default model (no classification head) fails
    to start with a clear reason instead of answering garbage scores: the
    engine reports it and the server stops with 1, as a failed model load
    stops llama-server."""
    rc, left, log = S.Server.failed_start("-c", "512", "-np", "1", "-t", "2", "-w", "1", "--reranking")
    assert rc == 1 and left == [], log[-3000:]
    assert "needs a model with a classification (rank) head" in log, log[-3000:]
