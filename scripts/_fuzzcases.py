"""Hostile request cases for scripts/fuzz.py, drawn with hypothesis.

Three families, each a hypothesis strategy of ``Case``:

* schema: bodies generated from the server's own /openapi.json request
  schemas (``from_schema`` below; additionalProperties true gives the extra
  fields);
* mutate: a valid body per endpoint with one to three mutations: a required
  field dropped, a field of the wrong type, huge / negative / fractional
  numbers, token ids out of vocabulary, a prompt longer than the context,
  n_predict huge, invalid UTF-8, lone surrogates (escaped and raw), deep
  nesting, extra fields;
* raw: byte-level bodies and framing: truncated JSON, invalid JSON, bodies
  over the limit (Content-Length and chunked), wrong methods and paths, odd
  slot ids and actions, a declared length longer than what is sent.

Why generated requests are kept cheap: a valid request generates tokens, so
every integer n_predict-like field is capped at 8 (the server runs with -n 8
for the absent case) except in the cases built to be huge.
"""
from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass

from hypothesis import strategies as st

N_VOCAB = 262144
LIMIT_FIELDS = ("n_predict", "max_tokens", "max_completion_tokens")
CHAT = [{"role": "user", "content": "Say hi."}]
VALID = {
    "/completion": {"prompt": "Hello there", "n_predict": 4, "temperature": 0},
    "/completions": {"prompt": [2, 9259, 1902], "n_predict": 2},
    "/v1/completions": {"prompt": "Once upon", "max_tokens": 3, "model": "m"},
    "/v1/chat/completions": {"messages": CHAT, "max_tokens": 3},
    "/chat/completions": {"messages": CHAT, "max_tokens": 2, "stream": True},
    "/tokenize": {"content": "Hello world", "with_pieces": True},
    "/detokenize": {"tokens": [9259, 1902]},
    "/apply-template": {"messages": CHAT},
}
GETS = ("/health", "/v1/health", "/props", "/models", "/v1/models", "/slots", "/metrics", "/openapi.json")
JSON_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20), st.lists(st.integers(-5, N_VOCAB + 5), max_size=5), st.dictionaries(st.text(max_size=5),
                                                                                               st.integers(), max_size=3))
HUGE_INTS = st.sampled_from([2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, -(2**63), -(2**31) - 1, -1, -2, 0])


@dataclass
class Case:
    family: str
    label: str
    data: bytes  # the whole request as sent
    shut_wr: bool = False  # half-close after sending (truncated body)
    expect_answer: bool = True


def http(method: str, path: str, body: bytes | None = None, ctype: str = "application/json",
         length: int | None = None, chunked: bool = False) -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
    if body is None:
        return (head + "\r\n").encode()
    head += f"Content-Type: {ctype}\r\n"
    if chunked:
        out = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 4096]), body[i:i + 4096]) for i in range(0, len(body), 4096))
        return (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + out + b"0\r\n\r\n"
    n = len(body) if length is None else length
    return (head + f"Content-Length: {n}\r\n\r\n").encode() + body


def dumps(body) -> bytes:
    return json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")


def cap(body, huge: bool = False):
    """Keep generating requests short: a limit the server would accept and
    that exceeds 8 becomes 4 (out-of-range values stay: they test the 400)."""
    if isinstance(body, dict) and not huge:
        for k in LIMIT_FIELDS:
            v = body.get(k)
            if isinstance(v, int) and not isinstance(v, bool) and (8 < v < 2**31 or v == -1):
                body[k] = 4
        if isinstance(body.get("n"), int) and body["n"] > 2:
            body["n"] = 2
    return body


def post_case(family: str, label: str, path: str, body, huge: bool = False) -> Case:
    return Case(family, label, http("POST", path, dumps(cap(body, huge))))


# ------------------------------------------------------------------ schema
# Why our own converter and not hypothesis-jsonschema: that package leans on
# hypothesis internals, and a hypothesis release broke it (issue 11: every new
# machine failed the suite). Our schemas use a small subset of OpenAPI 3.0
# (frontends/api/openapi.py), which this covers; anything else draws any JSON.
def from_schema(sch: dict) -> st.SearchStrategy:
    """A strategy of JSON values valid for ``sch`` (type, properties,
    required, additionalProperties, items, minItems, enum, oneOf/anyOf,
    nullable, minimum/maximum)."""
    if "enum" in sch:
        out = st.sampled_from(sch["enum"])
    elif "oneOf" in sch or "anyOf" in sch:
        out = st.one_of([from_schema(s) for s in sch.get("oneOf", sch.get("anyOf"))])
    else:
        t = sch.get("type")
        lo, hi = sch.get("minimum"), sch.get("maximum")
        if t == "integer":
            out = st.integers(lo, hi)
        elif t == "number":
            out = st.floats(lo, hi, allow_nan=False, allow_infinity=False)
        elif t == "boolean":
            out = st.booleans()
        elif t == "string":
            out = st.text(max_size=40)
        elif t == "array":
            out = st.lists(from_schema(sch.get("items", {})), min_size=sch.get("minItems", 0), max_size=6)
        elif t == "object":
            out = _object(sch)
        else:
            out = JSON_VALUES
    return st.one_of(st.none(), out) if sch.get("nullable") else out


def _object(sch: dict) -> st.SearchStrategy:
    props = sch.get("properties", {})
    req = set(sch.get("required", ()))
    extra = st.dictionaries(st.text(min_size=1, max_size=8).filter(lambda k: k not in props), JSON_VALUES, max_size=2)

    @st.composite
    def draw_obj(draw) -> dict:
        out = {}
        for k, s in props.items():
            if k in req or draw(st.booleans()):
                out[k] = draw(from_schema(s))
        if sch.get("additionalProperties", True) is not False:
            out.update(draw(extra))
        return out

    return draw_obj()


def schema_cases(spec: dict) -> st.SearchStrategy[Case]:
    strats = []
    for path, ops in spec["paths"].items():
        rb = ops.get("post", {}).get("requestBody")
        if rb and "{" not in path:
            sch = rb["content"]["application/json"]["schema"]
            strats.append(from_schema(sch).map(lambda b, p=path: post_case("schema", p, p, b)))
    return st.one_of(strats)


# ------------------------------------------------------------------ mutate
def set_prompt(path: str, body: dict, text: str) -> None:
    if "messages" in VALID[path]:
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text


@st.composite
def mutate_cases(draw) -> Case:
    path = draw(st.sampled_from(sorted(VALID)))
    body = json.loads(json.dumps(VALID[path]))
    labels, huge = [], False
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from([
            "drop", "wrong_type", "huge_number", "negative", "fraction", "oov_tokens", "long_prompt",
            "n_predict_huge", "invalid_utf8", "lone_surrogate", "deep", "extra", "grammar", "logit_bias",
            "penalty_window"]))
        labels.append(kind)
        key = draw(st.sampled_from(sorted(body) or ["prompt"]))
        if kind == "drop":
            body.pop(key, None)
        elif kind == "wrong_type":
            body[key] = draw(JSON_VALUES)
        elif kind in ("huge_number", "negative", "fraction"):
            k = draw(st.sampled_from(["n_predict", "max_tokens", "temperature", "top_k", "top_p", "min_p", "seed",
                                      "n_probs", "id_slot", "repeat_last_n", "repeat_penalty", "n", "logprobs",
                                      "top_logprobs", "typical_p", "presence_penalty", "frequency_penalty"]))
            body[k] = draw(HUGE_INTS if kind == "huge_number" else st.integers(-(2**40), -1) if kind == "negative"
                           else st.floats(-1e308, 1e308, allow_nan=False))
        elif kind == "oov_tokens":
            bad = draw(st.lists(st.one_of(st.integers(N_VOCAB, 2**62), st.integers(-(2**62), -1)), min_size=1, max_size=3))
            field = {"/detokenize": "tokens"}.get(path, "prompt")
            body[field] = [2, 9259] + bad if draw(st.booleans()) else [["text", *bad]]
        elif kind == "long_prompt":
            set_prompt(path, body, "hello " * draw(st.integers(520, 3000)))
        elif kind == "n_predict_huge":  # a prompt near the slot's end: huge n_predict ends at the context
            set_prompt(path, body, "hello " * 480)
            body[draw(st.sampled_from(LIMIT_FIELDS))] = draw(st.sampled_from([2**31 - 1, 10**9, -1]))
            huge = True
        elif kind == "invalid_utf8":
            case = Case("mutate", path + ":invalid_utf8", b"")
            raw = dumps(body).replace(b"Hello", b"He\xff\xfe\xc3llo", 1).replace(b'"', b'"\xed\xa0\x80', 1)
            case.data = http("POST", path, raw)
            return case
        elif kind == "lone_surrogate":
            s = draw(st.sampled_from(["\\ud800", "\\udfff", "a\\ud83d", "\\udc00b"]))
            raw = dumps(body)
            raw = raw.replace(b'"', f'"{s}'.encode(), 1) if draw(st.booleans()) else raw.replace(b"}", f', "x{s}": "{s}"}}'.encode(), 1)
            return Case("mutate", path + ":lone_surrogate", http("POST", path, raw))
        elif kind == "deep":
            depth = draw(st.integers(50, 5000))
            raw = dumps(body)[:-1] + b', "deep": ' + b"[" * depth + b"]" * depth + b"}"
            return Case("mutate", path + ":deep", http("POST", path, raw))
        elif kind == "penalty_window":  # sizes the engine allocates from
            body.update(repeat_last_n=draw(HUGE_INTS), repeat_penalty=1.1, top_k=draw(HUGE_INTS))
        elif kind == "extra":
            body[draw(st.text(min_size=1, max_size=12))] = draw(JSON_VALUES)
        elif kind == "grammar":
            body[draw(st.sampled_from(["grammar", "json_schema"]))] = draw(st.one_of(
                st.text(max_size=60), st.just('root ::= "a" root'), st.just("root ::= " + "(" * 300 + '"x"' + ")" * 300),
                st.just('root ::= "a"{0,100000}'), st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=3)))
        elif kind == "logit_bias":
            body["logit_bias"] = draw(st.one_of(
                st.dictionaries(st.text(max_size=8), st.one_of(st.floats(allow_nan=True), st.booleans()), max_size=3),
                st.lists(st.lists(st.one_of(st.integers(-(2**40), 2**40), st.text(max_size=4)), min_size=1, max_size=3),
                         max_size=3)))
    return post_case("mutate", path + ":" + "+".join(labels), path, body, huge)


# ------------------------------------------------------------------ raw
@st.composite
def raw_cases(draw, limit: int) -> Case:
    kind = draw(st.sampled_from(["truncated", "invalid_json", "over_limit", "over_limit_chunked", "short_length",
                                 "empty", "wrong_method", "unknown_path", "slot_id", "get", "content_type"]))
    path = draw(st.sampled_from(sorted(VALID)))
    body = dumps(VALID[path])
    if kind == "truncated":
        return Case("raw", kind, http("POST", path, body[: draw(st.integers(0, len(body) - 1))]))
    if kind == "invalid_json":
        bad = draw(st.sampled_from([b"{", b"[1,2", b'{"prompt": NaN}', b'{"prompt": "a",}', b"{'prompt': 'a'}",
                                    b'{"prompt": Infinity}', b"nul", b'{"n_predict": 1e999, "prompt": "a"}',
                                    b'{"prompt": "a", "n_predict": 123456789012345678901234567890}', b"\x00\x01\x02",
                                    b'{"prompt": "\\u00"}', b"\xef\xbb\xbf{}", b'"just a string"', b"[]", b"true"]))
        return Case("raw", kind, http("POST", path, bad))
    if kind in ("over_limit", "over_limit_chunked"):
        big = b'{"prompt": "' + b"a" * (limit + draw(st.integers(1, 4096))) + b'"}'
        return Case("raw", kind, http("POST", path, big, chunked=kind.endswith("chunked")))
    if kind == "short_length":  # declares more than it sends, then half-closes
        return Case("raw", kind, http("POST", path, body, length=len(body) + draw(st.integers(1, 1000))), shut_wr=True,
                    expect_answer=False)
    if kind == "empty":
        return Case("raw", kind, http("POST", path, b""))
    if kind == "wrong_method":
        m = draw(st.sampled_from(["GET", "PUT", "DELETE", "PATCH"]))
        return Case("raw", kind, http(m, path, body if m != "GET" else None))
    if kind == "unknown_path":
        p = "/" + urllib.parse.quote(draw(st.text(max_size=20)), safe="")
        return Case("raw", kind, http(draw(st.sampled_from(["GET", "POST"])), p, body))
    if kind == "slot_id":
        sid = urllib.parse.quote(draw(st.one_of(st.integers(-(2**70), 2**70).map(str), st.text(max_size=8))), safe="")
        action = urllib.parse.quote(draw(st.sampled_from(["erase", "save", "restore", "", "x", "ERASE"])))
        return Case("raw", kind, http("POST", f"/slots/{sid or '0'}?action={action}", b""))
    if kind == "get":
        q = draw(st.sampled_from(["", "?fail_on_no_slot=1", "?x=%ff"]))
        return Case("raw", kind, http("GET", draw(st.sampled_from(GETS)) + q))
    ctype = draw(st.sampled_from(["text/plain", "application/x-www-form-urlencoded", "", "application/json; charset=latin-1"]))
    return Case("raw", kind, http("POST", path, body, ctype=ctype))


def families(spec: dict, limit: int) -> dict[str, st.SearchStrategy[Case]]:
    """Each family's strategy; fuzz.py draws a fixed share from each (one_of
    would favour its first, cheapest branches)."""
    return {"schema": schema_cases(spec), "mutate": mutate_cases(), "raw": raw_cases(limit)}
