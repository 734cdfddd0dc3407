"""Numeric request fields read as the vendored llama-server reads them.

server-schema.cpp field_num::eval: ``set_limits`` rows clamp into their
bounds, ``set_hard_limits`` rows answer 400 "Value must be between", rows
without limits take any value of the type; server-schema.h's
``get<T>()`` (nlohmann) truncates a float for an integer, reads a boolean
as 0/1 and wraps an integer to 32 bits (seed is a uint32_t: -2 is
0xFFFFFFFE); id_slot is json_value's (a wrong type is -1) and wraps modulo
the slots (server-context.cpp get_slot_by_id); chat's top_logprobs is
copied to n_probs without a limit (server-common.cpp). Each case shows the
value generation_settings reports (built from the validated record), in
process against the fake engine (testing.TestClient)."""
from __future__ import annotations

import pytest

from frontends.testing import TestClient

FLT_MAX = 3.4028234663852886e38
MSG = [{"role": "user", "content": "x"}]


@pytest.fixture(scope="module")
def app():
    with TestClient("-np", "3") as c:  # 3 slots: id_slot -2 is (2**64 - 2) % 3 = 2
        yield c


def settings(app, path: str, body: dict) -> dict:
    extra = {"messages": MSG} if "chat" in path else {"prompt": "a"}
    r = app.simulate_post(path, json={**extra, "n_predict": 1, "verbose": True, **body})
    assert r.status_code == 200, (body, r.text)
    out = r.json if path == "/completion" else r.json["__verbose"]
    return out


CASES = [  # (field, request value, generation_settings value)
    # soft limits (set_limits): clamped
    ("top_k", -5, 0), ("top_k", 2**31 + 5, 0),  # int64 -> int32 wraps it negative, then the limit clamps it
    ("top_p", 3, 1.0), ("top_p", -1, 0.0),
    ("min_p", 2, 1.0), ("temperature", -1, 0.0), ("temperature", 1e39, FLT_MAX),
    ("mirostat", 7, 2), ("mirostat", -3, 0), ("xtc_probability", 2, 1.0), ("xtc_threshold", -1, 0.0),
    # no limits: any value of the type (a float past the float range is FLT_MAX, field_num's default limits)
    ("typical_p", 1.5, 1.5), ("typical_p", -0.5, -0.5), ("repeat_penalty", -1, -1.0), ("repeat_penalty", 0, 0.0),
    ("presence_penalty", 1e39, FLT_MAX), ("frequency_penalty", -3, -3.0), ("top_n_sigma", 2, 2.0),
    ("dynatemp_range", 1.5, 1.5),
    # integers: a float truncated toward zero, a boolean 0/1, past 32 bits wrapped
    ("top_k", 2.9, 2), ("top_k", True, 1), ("top_k", 2**32 + 7, 7), ("repeat_last_n", 3.7, 3),
    ("n_keep", -1.5, -1), ("n_discard", 4.2, 4), ("min_keep", 3, 3), ("dry_allowed_length", 1.5, 1),
    ("n_predict", True, 1), ("frequency_penalty", True, 1.0),
    # seed: a uint32 (-1 = 0xFFFFFFFF: random)
    ("seed", -2, 2**32 - 2), ("seed", 2**40 + 5, 5), ("seed", -1, 2**32 - 1), ("seed", 1.9, 1), ("seed", True, 1),
    # n_probs: no limit; ringserve's record holds 0..20 (MAX_PROBS; llama-server shows -1 as -1)
    ("n_probs", 50, 20), ("n_probs", -1, 0), ("n_probs", 2.5, 2),
]


@pytest.mark.parametrize("field,value,shown", CASES)
def test_completion_reads_as_llama_server(app, field, value, shown):
    assert settings(app, "/completion", {field: value})["generation_settings"][field] == shown


def test_each_endpoint_and_aliases(app):
    for path in ("/completion", "/v1/completions", "/v1/chat/completions"):
        gs = settings(app, path, {"top_p": 7, "top_k": -1, "seed": -2, "repeat_last_n": 2.5})["generation_settings"]
        assert (gs["top_p"], gs["top_k"], gs["seed"], gs["repeat_last_n"]) == (1.0, 0, 2**32 - 2, 2), path
    gs = settings(app, "/v1/completions", {"max_tokens": 1.9})["generation_settings"]
    assert gs["n_predict"] == 1  # an alias reads the same way
    assert settings(app, "/v1/completions", {"logprobs": 50})["generation_settings"]["n_probs"] == 20
    assert settings(app, "/completion", {"logprobs": 3.9})["generation_settings"]["n_probs"] == 3


def test_chat_logprobs(app):
    def n_probs(body):
        return settings(app, "/v1/chat/completions", body)["generation_settings"]["n_probs"]

    assert n_probs({"logprobs": True, "top_logprobs": 50}) == 20  # no limit there; the record's cap
    assert n_probs({"logprobs": True, "top_logprobs": "x"}) == 20  # json_value: a wrong type is 20
    assert n_probs({"logprobs": True, "top_logprobs": 2.7}) == 2
    assert n_probs({"logprobs": 3}) == 3  # not a boolean: the native schema's n_probs alias reads it
    r = app.simulate_post("/v1/chat/completions", json={"messages": MSG, "n_predict": 1, "logprobs": True,
                                                        "top_logprobs": 50})
    assert r.status_code == 200 and len(r.json["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) <= 20


def test_id_slot_wraps_modulo_the_slots(app):
    for value, slot in ((7, 1), (-2, 2), (4.9, 1), (True, 1), (2, 2)):
        r = settings(app, "/completion", {"id_slot": value})
        assert r["generation_settings"]["id_slot"] == slot and r["id_slot"] == slot, value
    for value in (-1, "x", [0]):  # -1 and json_value's wrong types: the best free slot
        assert settings(app, "/completion", {"id_slot": value})["generation_settings"]["id_slot"] == -1


REFUSED = [  # hard limits (set_hard_limits) and get<T>'s type errors: 400 in llama-server's shape
    ("n_predict", -2, "Value must be between -1 <= value <= 2147483647, but got -2"),
    ("n_predict", 2**31, "but got -2147483648"),  # int32 wrap, then the hard limit
    ("n_predict", -2.5, "but got -2"), ("repeat_last_n", -1, "0 <= value"), ("n_keep", -2, "-1 <= value"),
    ("n_discard", -1, "0 <= value"), ("min_keep", -1, "0 <= value"), ("dry_penalty_last_n", -1, "0 <= value"),
    ("dry_allowed_length", -1, "0 <= value"), ("speculative.p_min", 2, "0.000000 <= value <= 1.000000"),
    ("top_p", "x", "type must be number, but is string"), ("seed", "1", "type must be number, but is string"),
    ("top_k", [1], "but is array"), ("n_probs", {}, "but is object"), ("mirostat", "2", "but is string"),
    ("dynatemp_range", "x", "but is string"), ("temperature", "hot", "but is string"),
    # a worker-side row read by field_num too (the stream's ping interval, tests/test_sse_ping.py)
    ("sse_ping_interval", -2, "-1 <= value <= 2147483647, but got -2"), ("sse_ping_interval", "30", "but is string"),
]


@pytest.mark.parametrize("field,value,words", REFUSED)
def test_refused(app, field, value, words):
    before = int(app.arena.count("requests_total"))
    for path in ("/completion", "/v1/completions", "/v1/chat/completions"):
        extra = {"messages": MSG} if "chat" in path else {"prompt": "a"}
        r = app.simulate_post(path, json={**extra, field: value})
        assert r.status_code == 400, (path, field, value)
        e = r.json["error"]
        assert e["code"] == 400 and e["type"] == "invalid_request_error"
        assert e["message"].startswith(f"Field '{field}': ") and words in e["message"], e["message"]
    assert int(app.arena.count("requests_total")) == before


def test_refused_aliases_and_chat(app):
    r = app.simulate_post("/v1/completions", json={"prompt": "a", "logprobs": "x"})
    assert r.status_code == 400 and r.json["error"]["message"].startswith("Field 'logprobs': ")
    r = app.simulate_post("/v1/chat/completions", json={"messages": MSG, "logprobs": "yes"})
    assert r.status_code == 400 and r.json["error"]["message"].startswith("Field 'logprobs': ")
    r = app.simulate_post("/v1/chat/completions", json={"messages": MSG, "top_logprobs": 2})
    assert r.status_code == 400 and r.json["error"]["message"] == "top_logprobs requires logprobs to be set to true"
    r = app.simulate_post("/v1/chat/completions", json={"messages": MSG, "logprobs": False, "top_logprobs": 2})
    assert r.status_code == 400
