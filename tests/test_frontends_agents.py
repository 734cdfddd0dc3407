"""/v1/responses, /v1/messages and /infill: shapes, streams, the official
clients and every 4xx, in-process against the fake engine (which echoes the
prompt, so what the model saw is visible in the answer). The real model's
run is tests/test_agents_real.py."""
from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from frontends import testing
from frontends.api.infill import Fim, infill_prompt
from frontends.testing import TestClient


@pytest.fixture(scope="module")
def srv():
    with TestClient("-a", "fake-model", "--threads-http", "8", token_s=0.001) as c:
        yield c


def post(srv, path, body):
    return srv.simulate_post(path, json=body)


def named_events(raw: bytes) -> list[tuple[str, dict]]:
    """(event name, data) of each SSE event; every event has both lines."""
    import orjson

    out = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        lines = block.split("\n")
        assert lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        data = orjson.loads(lines[1][6:])
        assert data["type"] == lines[0][7:] or lines[0] == "event: error"
        out.append((lines[0][7:], data))
    return out


def wsgi(srv) -> httpx.Client:
    return httpx.Client(transport=httpx.WSGITransport(app=srv.app))


# ------------------------------------------------------------- /v1/responses
def test_responses_text(srv):
    r = post(srv, "/v1/responses", {"input": "hi there", "instructions": "be brief", "max_output_tokens": 4})
    assert r.status_code == 200
    j = r.json
    assert j["object"] == "response" and j["id"].startswith("resp_") and j["model"] == "fake-model"
    # the fake engine echoes the rendered chat: the system text comes first (gemma folds it into the user turn)
    text = j["output"][0]["content"][0]["text"]
    assert j["output"][0]["content"][0]["type"] == "output_text" and text and "user\nbe brief\n\nhi".startswith(text)
    assert j["status"] == "incomplete" and j["incomplete_details"] == {"reason": "max_output_tokens"}
    u = j["usage"]
    assert u["output_tokens"] == 4 and u["total_tokens"] == u["input_tokens"] + 4


def test_responses_item_list_and_stream(srv):
    items = [{"role": "user", "content": "first"},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
             {"role": "user", "content": [{"type": "input_text", "text": "second"}]}]
    r = post(srv, "/v1/responses", {"input": items, "stream": True})  # fake: EOS after the echo
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    ev = named_events(r.content)
    names = [n for n, _ in ev]
    assert names[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert names[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert [d["sequence_number"] for _, d in ev] == list(range(len(ev)))
    deltas = "".join(d["delta"] for n, d in ev if n == "response.output_text.delta")
    done = ev[-1][1]["response"]
    assert deltas == ev[-4][1]["text"] == done["output"][0]["content"][0]["text"]
    assert "first" in deltas and "ok" in deltas and "second" in deltas  # the whole history reached the engine
    assert done["status"] == "completed" and done["usage"]["output_tokens"] > 0


def test_responses_echo_the_value_read():
    """max_output_tokens 1.5 is read as 1 (llama-server's get<int>), and the response object says 1."""
    with TestClient(token_s=0.0005) as c:
        r = c.simulate_post("/v1/responses", json={"input": "one two three", "max_output_tokens": 1.5})
        assert r.status_code == 200 and r.json["max_output_tokens"] == 1 and r.json["usage"]["output_tokens"] == 1


def test_responses_openai_client(srv):
    c = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=wsgi(srv))
    r = c.responses.create(model="m", input="colours", max_output_tokens=3)
    assert r.output_text.startswith("user\ncolours"[: len(r.output_text)]) and r.usage.output_tokens == 3
    events = list(c.responses.create(model="m", input="colours", stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-1].response.output_text and "colours" in text


@pytest.mark.parametrize("body, words", [
    ({}, "'input' is required"),
    ({"input": 5}, "'input' must be"),
    ({"input": []}, "'input' must be"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "not supported"),
    ({"input": [{"type": "function_call_output", "call_id": "x"}]}, "needs a string 'call_id' and an 'output'"),
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "x", "max_output_tokens": "many"}, "max_output_tokens"),
    ({"input": "x", "temperature": "hot"}, "temperature"),
    # a reasoning item as llama-server checks it (was a 500: TypeError)
    ({"input": [{"type": "reasoning", "summary": [], "content": 5}]}, "non-empty array"),
    ({"input": [{"type": "reasoning", "summary": [], "content": []}]}, "non-empty array"),
    ({"input": [{"type": "reasoning", "summary": [], "content": [{"text": 5}]}]}, "string 'text'"),
])
def test_responses_bad_input(srv, body, words):
    r = post(srv, "/v1/responses", body)
    assert r.status_code == 400 and r.json["error"]["type"] == "invalid_request_error"
    assert words in r.json["error"]["message"]


# -------------------------------------------------------------- /v1/messages
def test_messages_text(srv):
    body = {"model": "m", "max_tokens": 5, "system": [{"type": "text", "text": "sys"}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]}
    r = post(srv, "/v1/messages", body)
    assert r.status_code == 200
    j = r.json
    assert j["type"] == "message" and j["role"] == "assistant" and j["id"].startswith("msg_")
    assert j["content"][0]["type"] == "text" and "user\nsys\n\nhello".startswith(j["content"][0]["text"])
    assert j["stop_reason"] == "max_tokens" and j["stop_sequence"] is None and j["usage"]["output_tokens"] == 5


def test_messages_stop_sequence_and_stream(srv):
    body = {"max_tokens": 30, "stop_sequences": ["hello"], "messages": [{"role": "user", "content": "hello"}]}
    j = post(srv, "/v1/messages", body).json
    assert j["stop_reason"] == "stop_sequence" and j["stop_sequence"] == "hello"
    assert "hello" not in j["content"][0]["text"]
    r = post(srv, "/v1/messages", {**body, "stream": True, "stop_sequences": []})
    ev = named_events(r.content)
    names = [n for n, _ in ev]
    assert names[0] == "message_start" and names[1] == "content_block_start"
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[2:-3]) == {"content_block_delta"}
    text = "".join(d["delta"]["text"] for n, d in ev if n == "content_block_delta")
    assert "hello" in text
    md = ev[-2][1]
    assert md["delta"]["stop_reason"] == "max_tokens" and md["usage"]["output_tokens"] > 0


def test_messages_anthropic_client(srv):
    import httpx2  # the anthropic SDK's own httpx fork

    http = httpx2.Client(transport=httpx2.WSGITransport(app=srv.app))
    c = anthropic.Anthropic(base_url="http://testserver", api_key="none", http_client=http, max_retries=0)
    m = c.messages.create(model="m", max_tokens=3, messages=[{"role": "user", "content": "blue"}])
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3 and m.content[0].type == "text"
    with c.messages.stream(model="m", max_tokens=8, messages=[{"role": "user", "content": "blue"}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert "blue" in text and final.content[0].text == text and final.stop_reason == "max_tokens"
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model="m", max_tokens=0, messages=[{"role": "user", "content": "x"}])
    assert "max_tokens" in str(e.value)


@pytest.mark.parametrize("body, words", [
    ({"messages": [{"role": "user", "content": "x"}]}, "max_tokens: Field required"),
    ({"max_tokens": 4}, "'messages' is required"),
    ({"max_tokens": 4, "messages": []}, "non-empty"),
    ({"max_tokens": 4, "messages": [{"role": "system", "content": "x"}]}, "'role'"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image"}]}]}, "not supported"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": 3}]}, "'content'"),
    ({"max_tokens": 4, "system": 7, "messages": [{"role": "user", "content": "x"}]}, "'system'"),
    ({"max_tokens": 4, "stop_sequences": "x", "messages": [{"role": "user", "content": "x"}]}, "stop"),
    ({"max_tokens": 4, "top_p": "2", "messages": [{"role": "user", "content": "x"}]}, "top_p"),
    # were a 500 (TypeError) and an empty user turn
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "thinking", "thinking": 5}]}]},
     "string 'thinking'"),
    ({"max_tokens": 4, "thinking": {"type": "disabled"}, "chat_template_kwargs": 5,
      "messages": [{"role": "user", "content": "x"}]}, "chat_template_kwargs"),
    ({"max_tokens": 4, "messages": [{"role": "user"}]}, "must contain 'content'"),
])
def test_messages_bad_input(srv, body, words):
    r = post(srv, "/v1/messages", body)
    assert r.status_code == 400, r.json
    e = r.json
    assert e["type"] == "error" and e["error"]["type"] == "invalid_request_error" and e["error"]["code"] == 400
    assert words in e["error"]["message"]


# ------------------------------------------------------------------- /infill
def test_infill_unsupported_model(srv):
    """gemma 3 has no FIM tokens: llama-server's 501, before the body is read."""
    r = post(srv, "/infill", {"input_prefix": "def f(", "input_suffix": ")"})
    assert r.status_code == 501 and r.json["error"]["type"] == "not_supported_error"
    assert r.json["error"]["message"].startswith("Infill is not supported by this model: prefix token is missing.")


class _Vocab:
    """A vocabulary that tokenizes each character to its code point."""

    def tokenize(self, s: str, add_special: bool, parse_special: bool) -> list[int]:
        return [ord(c) for c in s]

    def valid(self, t: int) -> bool:
        return 0 <= t < 1000


def test_infill_prompt_layout():
    """llama-server's format_prompt_infill, token for token: repo and file
    separators, extra chunks before BOS, prefix (+ prompt) then suffix then MID,
    and the 3/4 : 1/4 batch split."""
    fim = Fim(pre=900, suf=901, mid=902, rep=903, sep=904)
    t = lambda s: [ord(c) for c in s]  # noqa: E731
    ids = infill_prompt(_Vocab(), fim, "ab", "cd", [{"text": "X", "filename": "f"}], t("p"),
                        n_batch=64, n_predict=4, n_ctx=4096, add_bos=True, bos=2)
    assert ids == ([903] + t("myproject\n") + [904] + t("f\n") + t("X") + [904] + t("filename\n")
                   + [2, 900] + t("ab") + t("p") + [901] + t("cd") + [902])
    no_sep = Fim(pre=900, suf=901, mid=902)
    ids = infill_prompt(_Vocab(), no_sep, "a" * 100, "b" * 100, [{"text": "Y"}], [], n_batch=16, n_predict=0,
                        n_ctx=16, add_bos=False, bos=2)
    assert ids == [900] + t("a" * 12) + [901] + t("b" * 2) + [902]  # no room for extra; 3/4 and 1/4 - 2 of 16
    assert Fim(-1, 5, -1).missing() == "prefix token is missing. middle token is missing. "


def test_count_tokens(srv):
    """The prompt's tokens without generating: the same count the answer's usage reports."""
    msgs = {"max_tokens": 3, "system": "sys", "messages": [{"role": "user", "content": "hello there"}]}
    n = post(srv, "/v1/messages/count_tokens", msgs).json
    u = post(srv, "/v1/messages", msgs).json["usage"]  # input_tokens excludes the cache_read ones, as Anthropic's
    assert n == {"input_tokens": u["input_tokens"] + u["cache_read_input_tokens"]}
    body = {"input": "hello there", "instructions": "sys", "max_output_tokens": 3}
    n = post(srv, "/v1/responses/input_tokens", body).json
    assert n == {"object": "response.input_tokens",
                 "input_tokens": post(srv, "/v1/responses", body).json["usage"]["input_tokens"]}
    assert post(srv, "/v1/messages/count_tokens", {"messages": 1}).status_code == 400
    assert post(srv, "/v1/responses/input_tokens", {}).status_code == 400
    # past the context: counted, not refused (a client asks this to learn that it must compact)
    long = {"messages": [{"role": "user", "content": "x " * 5000}]}
    r = post(srv, "/v1/messages/count_tokens", long)
    assert r.status_code == 200 and r.json["input_tokens"] > srv.cfg.ctx_size, r.json
    assert post(srv, "/v1/messages", {**long, "max_tokens": 3}).status_code == 400  # the answer is refused


def test_messages_stream_start_reports_the_cache():
    """message_start's usage splits the prompt into cached and new tokens as
    message_delta's and the whole answer's do (llama-server's partial
    to_json_anthropic); it said 0 cached on a cache hit. An assistant
    message without content is skipped, as llama-server does."""
    with TestClient(token_s=0.0005) as c:
        body = {"max_tokens": 8, "messages": [{"role": "user", "content": "one two three four five six"},
                                              {"role": "assistant"}]}
        post(c, "/v1/messages", body)  # the prompt is cached now
        ev = dict(named_events(post(c, "/v1/messages", {**body, "stream": True}).content))
        start, delta = ev["message_start"]["message"]["usage"], ev["message_delta"]["usage"]
        assert start["cache_read_input_tokens"] > 0, start
        assert {k: start[k] for k in ("cache_read_input_tokens", "input_tokens")} == \
            {k: delta[k] for k in ("cache_read_input_tokens", "input_tokens")}, (start, delta)


def test_openapi_lists_new_paths(srv):
    paths = srv.simulate_get("/openapi.json").json["paths"]
    for p in ("/infill", "/v1/responses", "/responses", "/v1/messages", "/v1/messages/count_tokens",
              "/v1/responses/input_tokens", "/embedding", "/embeddings",
              "/v1/embeddings", "/rerank", "/v1/rerank", "/reranking"):
        assert "post" in paths[p], p
    assert testing is not None


# ------------------------------------------------------ embeddings and rerank
def test_embeddings_need_the_flag(srv):
    """llama-server's 501s without --embedding (and --reranking)."""
    for path in ("/embedding", "/embeddings", "/v1/embeddings"):
        r = post(srv, path, {"input": "x"})
        assert r.status_code == 501 and "Start it with `--embeddings`" in r.json["error"]["message"]
    for path in ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking"):
        r = post(srv, path, {"query": "x", "documents": ["y"]})
        assert r.status_code == 501 and "Start it with `--reranking`" in r.json["error"]["message"]


def test_embedding_server_pooling_none():
    """--embedding on a model whose pooling is none (gemma 3's GGUF has no
    pooling_type): /v1/embeddings is llama-server's 400, per-token vectors are
    a 501 here, and the completion routes are llama-server's 501."""
    with TestClient("--embedding", token_s=0.001) as c:
        r = c.simulate_post("/v1/embeddings", json={"input": "x"})
        assert r.status_code == 400 and "not OAI compatible" in r.json["error"]["message"]
        r = c.simulate_post("/embedding", json={"content": "x"})
        assert r.status_code == 501 and "--pooling" in r.json["error"]["message"]
        for path in ("/completion", "/v1/chat/completions", "/v1/responses", "/v1/messages", "/infill"):
            r = c.simulate_post(path, json={"prompt": "x"})
            assert r.status_code == 501 and "without `--embeddings`" in r.json["error"]["message"], path


def test_embedding_normalize_matches_llama_cpp():
    """common_embd_normalize's cases, including the int16 scale and p-norms."""
    import numpy as np

    from frontends.api.embed import normalize

    v = np.array([3.0, -4.0], np.float32)
    assert np.allclose(normalize(v, 2), [0.6, -0.8]) and np.allclose(normalize(v, -1), v)
    assert np.allclose(normalize(v, 1), [3 / 7, -4 / 7]) and np.allclose(normalize(v, 0), [3 * 32760 / 4, -32760])
    assert np.allclose(normalize(v, 3), v / (27 + 64) ** (1 / 3))
    assert np.array_equal(normalize(np.zeros(3, np.float32), 2), np.zeros(3))


def _vector_client(*flags: str) -> TestClient:
    c = TestClient(*flags, "--threads-http", "8", token_s=0.001)
    c.fake.embd = 4  # the fake answers (prompt length, sum of ids mod 997, 0, 0)
    return c


def test_embeddings_worker_path():
    """More inputs than slots go in waves and come back in order; token-id
    inputs, native and OpenAI shapes, base64, usage."""
    import base64

    import numpy as np

    with _vector_client("--embedding", "--pooling", "mean") as c:
        texts = ["a", "b c", "d e f g", "one two three four five", "x", "hello world", "z z z"]
        ids = [c.simulate_post("/tokenize", json={"content": t, "add_special": True}).json["tokens"] for t in texts]
        r = c.simulate_post("/v1/embeddings", json={"input": texts, "embd_normalize": -1, "model": "mine"}).json
        assert r["model"] == "mine" and [d["index"] for d in r["data"]] == list(range(len(texts)))
        assert [d["embedding"][:2] for d in r["data"]] == [[len(i), sum(i) % 997] for i in ids]
        assert r["usage"] == {"prompt_tokens": sum(map(len, ids)), "total_tokens": sum(map(len, ids))}
        r = c.simulate_post("/v1/embeddings", json={"input": ids[1], "encoding_format": "base64"}).json
        v = np.frombuffer(base64.b64decode(r["data"][0]["embedding"]), "<f4")
        want = np.array([len(ids[1]), sum(ids[1]) % 997, 0, 0], np.float64)
        assert r["data"][0]["encoding_format"] == "base64" and np.allclose(v, want / np.linalg.norm(want))
        r = c.simulate_post("/embeddings", json={"content": [ids[0], "b c"], "embd_normalize": -1}).json
        assert r == [{"index": 0, "embedding": [[len(ids[0]), sum(ids[0]) % 997, 0, 0]]},
                     {"index": 1, "embedding": [[len(ids[1]), sum(ids[1]) % 997, 0, 0]]}]


def test_rerank_worker_path():
    """Jina and TEI shapes, ordering by score (here: prompt length), top_n,
    return_text, and the 4xx answers."""
    with _vector_client("--reranking") as c:
        docs = ["short", "a somewhat longer document", "the longest document of them all, by far"]
        r = c.simulate_post("/v1/rerank", json={"query": "q", "documents": docs, "top_n": 2}).json
        assert r["object"] == "list" and [x["index"] for x in r["results"]] == [2, 1]
        assert r["results"][0]["relevance_score"] > r["results"][1]["relevance_score"]
        assert r["usage"]["prompt_tokens"] > 0
        t = c.simulate_post("/rerank", json={"query": "q", "texts": docs, "return_text": True}).json
        assert [x["index"] for x in t] == [2, 1, 0] and t[0]["text"] == docs[2] and "score" in t[0]
        for body, words in (({"documents": docs}, '"query" must be provided'),
                            ({"query": 1, "documents": docs}, '"query" must be a string'),
                            ({"query": "q", "documents": []}, "non-empty string array"),
                            ({"query": "q", "documents": ["a", 2]}, "non-empty string array"),
                            ({"query": "q", "documents": docs, "top_n": -1}, "top_n")):
            e = c.simulate_post("/rerank", json=body)
            assert e.status_code == 400 and words in e.json["error"]["message"], body


def test_rank_head_check():
    """The GGUF's tensor infos are read without loading it: gemma 3 has no
    cls / cls.output tensors, so --reranking refuses it (engine/embed.py)."""
    from engine.config import Config
    from engine.embed import has_rank_head
    from engine.gguf import tensor_names

    path = Config().model_path()
    names = tensor_names(path)
    assert "token_embd.weight" in names and "output_norm.weight" in names and len(names) == len(set(names))
    assert not has_rank_head(path)
