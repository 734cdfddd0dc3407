"""GET /openapi.json: an OpenAPI 3.0 description of the served endpoints.

Request schemas list the fields the validators in params.py accept, with their
types and ranges (the sampling ones from ipc/params.py's table); unknown fields are allowed (llama-server ignores them).
Every error response uses the ``Error`` schema.
"""
from __future__ import annotations

from ipc.params import BY_NAME, GENERATION

INT = {"type": "integer"}
NUM = {"type": "number"}
BOOL = {"type": "boolean"}
STR = {"type": "string"}
TOKENS = {"type": "array", "items": {"type": "integer", "minimum": 0}}
STOP = {"oneOf": [STR, {"type": "array", "items": STR}], "nullable": True}



def _sampling() -> dict:
    """The rows of ipc/params.py the validator checks (each alias too), then
    the fields with their own validators (params.py)."""
    out = {k: row.schema() for row in GENERATION if row.field or row.check for k in (row.name,) + row.aliases}
    out.update({
        "return_tokens": BOOL, "stream": BOOL, "stop": STOP, "grammar": STR, "json_schema": {"type": "object"},
        "logit_bias": {"oneOf": [{"type": "object"}, {"type": "array", "items": {"type": "array"}}]},
        "stream_options": {"type": "object", "properties": {"include_usage": BOOL}},
        "samplers": {"oneOf": [{"type": "array", "items": STR}, STR],
                     "description": "the sampler chain's order: names, or sampler chars (edskypmxt)"},
        "dry_sequence_breakers": {"type": "array", "items": STR, "minItems": 1},
    })
    return out


SAMPLING = _sampling()
# Tool calling (frontends/text/tools.py) and enforced structured output (frontends/text/schemas.py: a schema the grammar
# cannot enforce is a 400). parallel_tool_calls is a row of ipc/params.py, in SAMPLING.
FUNCTION = {"type": "object", "required": ["name"], "properties": {
    "name": {"type": "string", "pattern": "^[A-Za-z0-9_.\\-]{1,64}$"}, "description": STR,
    "parameters": {"type": "object", "description": "JSON schema of the arguments, enforced by a grammar"}}}
TOOLS = {
    "tools": {"type": "array", "items": {"type": "object", "required": ["function"], "properties": {
        "type": {"type": "string", "enum": ["function"]}, "function": FUNCTION}}},
    "tool_choice": {"oneOf": [{"type": "string", "enum": ["none", "auto", "required"]},
                              {"type": "object", "required": ["function"], "properties": {
                                  "type": {"type": "string", "enum": ["function"]},
                                  "function": {"type": "object", "required": ["name"], "properties": {"name": STR}}}}]},
}
RESPONSE_FORMAT = {"type": "object", "properties": {
    "type": {"type": "string", "enum": ["text", "json_object", "json_schema"]},
    "schema": {"type": "object", "description": "json_object: optional JSON schema (llama-server extension)"},
    "json_schema": {"type": "object", "properties": {"name": STR, "strict": BOOL, "schema": {"type": "object"}}}}}
PROMPT = {"oneOf": [STR, TOKENS, {"type": "array", "items": {"oneOf": [STR, INT]}},
                    {"type": "array", "items": {"oneOf": [STR, TOKENS]}}]}
MESSAGE = {"type": "object", "required": ["role"], "properties": {
    "role": STR, "content": {"oneOf": [STR, {"type": "array", "items": {"type": "object", "properties": {
        "type": {"type": "string", "enum": ["text"]}, "text": STR}, "required": ["type", "text"]}}],
        "nullable": True},
    "tool_calls": {"type": "array", "items": {"type": "object", "required": ["function"], "properties": {
        "id": STR, "type": {"type": "string", "enum": ["function"]}, "function": {
            "type": "object", "required": ["name"], "properties": {"name": STR, "arguments": STR}}}}},
    "tool_call_id": STR, "name": STR}}


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


def extra_paths(post, chat: dict) -> dict:
    """Infill, Responses, Anthropic Messages, embeddings and rerank (issue 16)."""
    infill = _obj({"input_prefix": {"oneOf": [STR, TOKENS]}, "input_suffix": {"oneOf": [STR, TOKENS]},
                   "input_extra": {"type": "array", "items": _obj({"text": STR, "filename": STR}, ["text"])},
                   "prompt": STR, **SAMPLING}, ["input_prefix", "input_suffix"])
    text_parts = {"oneOf": [STR, {"type": "array", "items": _obj({"type": STR, "text": STR}, ["type"])}]}
    responses = _obj({"input": {"oneOf": [STR, {"type": "array", "items": _obj({
        "type": STR, "role": {"type": "string", "enum": ["user", "assistant", "system", "developer"]},
        "content": text_parts})}]}, "instructions": STR, "model": STR,
        "max_output_tokens": {"type": "integer", "minimum": -1}, **SAMPLING}, ["input"])
    messages = _obj({"messages": {"type": "array", "minItems": 1, "items": _obj({
        "role": {"type": "string", "enum": ["user", "assistant"]}, "content": text_parts}, ["role", "content"])},
        "system": text_parts, "model": STR, "max_tokens": {"type": "integer", "minimum": 1},
        "stop_sequences": {"type": "array", "items": STR}, **SAMPLING}, ["messages", "max_tokens"])
    embd_in = {"oneOf": [STR, TOKENS, {"type": "array", "items": {"oneOf": [STR, TOKENS]}}]}
    embd = _obj({"input": embd_in, "content": embd_in, "model": STR,
                 "encoding_format": {"type": "string", "enum": ["float", "base64"]},
                 "embd_normalize": BY_NAME["embd_normalize"].schema()})
    rerank = _obj({"query": STR, "documents": {"type": "array", "items": STR}, "texts": {"type": "array", "items": STR},
                   "top_n": BY_NAME["top_n"].schema(), "return_text": BOOL, "model": STR}, ["query"])
    out = {
        "/infill": post("Fill in the middle with the model's FIM tokens (501 without them)", infill,
                        "completion", True),
        "/v1/responses": post("OpenAI Responses API (text)", responses, "response", True),
        "/responses": post("OpenAI Responses API (text)", responses, "response", True),
        "/v1/messages": post("Anthropic Messages API (text)", messages, "message", True),
        "/v1/messages/count_tokens": post("Prompt tokens of a Messages request", messages, "input_tokens"),
        "/v1/responses/input_tokens": post("Prompt tokens of a Responses request", responses, "input_tokens"),
        "/responses/input_tokens": post("Prompt tokens of a Responses request", responses, "input_tokens"),
    }
    for p in ("/embedding", "/embeddings"):
        out[p] = post("Embeddings (llama-server shape; 501 without --embedding)", embd, "embeddings")
    out["/v1/embeddings"] = post("OpenAI embeddings (501 without --embedding)", embd, "embeddings")
    for p in ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking"):
        out[p] = post("Rerank documents (501 unless --reranking / --pooling rank)", rerank, "ranks")
    return out


def spec() -> dict:
    completion = _obj({"prompt": PROMPT, **SAMPLING}, ["prompt"])
    oai_cmpl = _obj({"prompt": PROMPT, "model": STR, "n": {"type": "integer", "minimum": 1},
                     "logprobs": {"type": "integer", "minimum": 0, "maximum": 20}, **SAMPLING}, ["prompt"])
    chat = _obj({"messages": {"type": "array", "items": MESSAGE, "minItems": 1}, "model": STR,
                 "n": {"type": "integer", "minimum": 1}, "logprobs": BOOL,
                 "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
                 "response_format": RESPONSE_FORMAT, **TOOLS,
                 "add_generation_prompt": BOOL, "chat_template_kwargs": {"type": "object"},
                 "continue_final_message": {"oneOf": [BOOL, {"type": "string", "enum": ["content", "reasoning_content"]}]},
                 **SAMPLING},
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
        # what gateways read (fleet.py)
        "/v1/loads": get("The engine's load now (smg's WorkerLoadResponse)", "loads"),
        "/server_info": get("Model and capacity facts (SGLang's names)", "server info"),
        "/get_server_info": get("Same as /server_info", "server info"),
        "/model_info": get("Model facts (SGLang's names)", "model info"),
        "/get_model_info": get("Same as /model_info", "model info"),
        "/completion": post("Native completion", completion, "completion", True),
        "/completions": post("Native completion", completion, "completion", True),
        "/v1/completions": post("OpenAI text completion", oai_cmpl, "completion", True),
        "/v1/chat/completions": post("OpenAI chat completion", chat, "chat completion", True),
        "/chat/completions": post("OpenAI chat completion", chat, "chat completion", True),
        "/tokenize": post("Tokenize", _obj({"content": STR, "add_special": BOOL, "parse_special": BOOL,
                                             "with_pieces": BOOL}), "tokens"),
        "/detokenize": post("Detokenize", _obj({"tokens": TOKENS}), "content"),
        "/apply-template": post("Render the chat template", _obj({"messages": chat["properties"]["messages"],
                                                                  "add_generation_prompt": BOOL,
                                                                  "continue_final_message":
                                                                      chat["properties"]["continue_final_message"],
                                                                  "chat_template_kwargs": {"type": "object"}},
                                                                 ["messages"]),
                                "prompt"),
        "/chat/completions/input_tokens": post("Count a chat request's prompt tokens", chat, "input_tokens"),
        "/v1/chat/completions/input_tokens": post("Count a chat request's prompt tokens", chat, "input_tokens"),
        "/v1/completions/render": post("A completion request's prompts as token ids ([{token_ids}])", oai_cmpl,
                                       "token ids"),
        "/v1/chat/completions/render": post("A chat request's prompt as token ids ({token_ids})", chat, "token ids"),
        **extra_paths(post, chat),
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
