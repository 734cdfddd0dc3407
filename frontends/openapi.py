"""GET /openapi.json: an OpenAPI 3.0 description of the served endpoints.

Request schemas list the fields the validators in params.py accept, with their
types and ranges (the sampling ones from ipc/params.py's table); unknown fields are allowed (llama-server ignores them).
Every error response uses the ``Error`` schema.
"""
from __future__ import annotations

from ipc.params import PARAMS_TABLE

INT = {"type": "integer"}
NUM = {"type": "number"}
BOOL = {"type": "boolean"}
STR = {"type": "string"}
TOKENS = {"type": "array", "items": {"type": "integer", "minimum": 0}}
STOP = {"oneOf": [STR, {"type": "array", "items": STR}], "nullable": True}



def _sampling() -> dict:
    """The rows of ipc/params.py the validator checks (each alias too), then
    the fields with their own validators (params.py)."""
    out = {k: row.schema() for row in PARAMS_TABLE if row.field or row.check for k in (row.name,) + row.aliases}
    out.update({
        "return_tokens": BOOL, "stream": BOOL, "stop": STOP, "grammar": STR, "json_schema": {"type": "object"},
        "logit_bias": {"oneOf": [{"type": "object"}, {"type": "array", "items": {"type": "array"}}]},
        "stream_options": {"type": "object", "properties": {"include_usage": BOOL}},
    })
    return out


SAMPLING = _sampling()
PROMPT = {"oneOf": [STR, TOKENS, {"type": "array", "items": {"oneOf": [STR, INT]}},
                    {"type": "array", "items": {"oneOf": [STR, TOKENS]}}]}
MESSAGE = {"type": "object", "required": ["role"], "properties": {
    "role": STR, "content": {"oneOf": [STR, {"type": "array", "items": {"type": "object", "properties": {
        "type": {"type": "string", "enum": ["text"]}, "text": STR}, "required": ["type", "text"]}}],
        "nullable": True}}}


def _obj(props: dict, required=()) -> dict:
    out = {"type": "object", "properties": props, "additionalProperties": True}
    if required:
        out["required"] = list(required)
    return out


def _body(schema: dict) -> dict:
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def _resp(ok: str, stream: bool = False, codes=(400, 401, 503)) -> dict:
    content = {"application/json": {"schema": {}}}
    if stream:
        content["text/event-stream"] = {"schema": STR}
    out = {"200": {"description": ok, "content": content}}
    for c in codes:
        out[str(c)] = {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    return out


def spec() -> dict:
    completion = _obj({"prompt": PROMPT, **SAMPLING}, ["prompt"])
    oai_cmpl = _obj({"prompt": PROMPT, "model": STR, "n": {"type": "integer", "minimum": 1},
                     "logprobs": {"type": "integer", "minimum": 0, "maximum": 20}, **SAMPLING}, ["prompt"])
    chat = _obj({"messages": {"type": "array", "items": MESSAGE, "minItems": 1}, "model": STR,
                 "n": {"type": "integer", "minimum": 1}, "logprobs": BOOL,
                 "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
                 "response_format": {"type": "object", "properties": {
                     "type": {"type": "string", "enum": ["text", "json_object", "json_schema"]}}},
                 "add_generation_prompt": BOOL, "chat_template_kwargs": {"type": "object"}, **SAMPLING},
                ["messages"])
    get = lambda s, ok, codes=(401, 503): {"get": {"summary": s, "responses": _resp(ok, codes=codes)}}  # noqa: E731
    post = lambda s, body, ok, stream=False: {"post": {"summary": s, "requestBody": _body(body),  # noqa: E731
                                                       "responses": _resp(ok, stream, (400, 401, 413, 503))}}
    paths = {
        "/health": get("Liveness; 503 while the model loads", "ok", (503,)),
        "/v1/health": get("Same as /health", "ok", (503,)),
        "/props": get("Server properties", "props"),
        "/models": get("Models (ollama and OpenAI shapes)", "models"),
        "/v1/models": get("Models (ollama and OpenAI shapes)", "models"),
        "/slots": get("Per-slot state", "slots", (401, 501, 503)),
        "/metrics": get("Prometheus metrics", "metrics", (401, 501, 503)),
        "/completion": post("Native completion", completion, "completion", True),
        "/completions": post("Native completion", completion, "completion", True),
        "/v1/completions": post("OpenAI text completion", oai_cmpl, "completion", True),
        "/v1/chat/completions": post("OpenAI chat completion", chat, "chat completion", True),
        "/chat/completions": post("OpenAI chat completion", chat, "chat completion", True),
        "/tokenize": post("Tokenize", _obj({"content": STR, "add_special": BOOL, "parse_special": BOOL,
                                             "with_pieces": BOOL}), "tokens"),
        "/detokenize": post("Detokenize", _obj({"tokens": TOKENS}), "content"),
        "/apply-template": post("Render the chat template", _obj({"messages": chat["properties"]["messages"],
                                                                  "add_generation_prompt": BOOL}, ["messages"]),
                                "prompt"),
        "/slots/{id_slot}": {"post": {
            "summary": "Slot action: erase, or save / restore its KV (files in --slot-save-path)",
            "parameters": [{"name": "id_slot", "in": "path", "required": True, "schema": INT},
                           {"name": "action", "in": "query", "required": True,
                            "schema": {"type": "string", "enum": ["erase", "save", "restore"]}}],
            "requestBody": {"required": False, "content": {"application/json": {"schema": _obj({"filename": STR})}}},
            "responses": _resp("done", codes=(400, 401, 500, 501, 503))}},
    }
    return {
        "openapi": "3.0.3",
        "info": {"title": "ringserve", "version": "0.1.0",
                 "description": "llama-server and OpenAI compatible API served by ringserve"},
        "paths": paths,
        "components": {
            "schemas": {"Error": {"type": "object", "required": ["error"], "properties": {"error": {
                "type": "object", "required": ["code", "message", "type"],
                "properties": {"code": INT, "message": STR, "type": STR}}}}},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"},
                                "apiKey": {"type": "apiKey", "in": "header", "name": "X-Api-Key"}},
        },
        "security": [{}, {"bearer": []}, {"apiKey": []}],
    }


class OpenAPI:
    def __init__(self):
        self.doc = spec()

    def on_get(self, req, resp) -> None:
        resp.media = self.doc
