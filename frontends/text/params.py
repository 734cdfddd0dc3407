"""Request fields -> an engine submission plan, validated before any lease.

The sampling fields, their aliases, defaults and bounds are the rows of
ipc/params.py (llama-server's params_from_json, server-schema.cpp); the
server-side defaults (-n, --temp, --top-k, --top-p, --min-p, -s,
--cache-prompt) come from the Config. Anything wrong is a 400
raised here, so a bad request never reaches the engine. ``null`` counts as
absent, like llama-server's ``json_value``.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

from ipc import chain as chainhdr
from ipc.budget import unpack as unpack_budget
from ipc.layout import LAZY_GRAMMAR, MAX_BIAS, MAX_GRAMMAR, lazy_header
from ipc.params import GENERATION, PARAMS_TABLE, RECORD, U32, Cfg, Param

from .errors import bad
from .fields import get_bool, get_num, get_str, pick
from .schemas import enforceable

MAX_STOPS, MAX_STOP_LEN = 32, 512  # bounds the per-token partial-match search


class Lazy(str):
    """A lazy grammar this server built (a native tool-call format's,
    toolfmt/grammar.py): the only grammar whose first line the engine may
    read as a lazy grammar's header (``plan``: a request's own grammar that
    starts the same way is moved a line down, where it is a comment)."""


def get_stops(body: dict) -> list[str]:
    v = body.get("stop")
    if v is None:
        return []
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise bad("Field 'stop': expected a string or an array of strings")
    if len(v) > MAX_STOPS or any(len(s) > MAX_STOP_LEN for s in v):
        raise bad(f"Field 'stop': at most {MAX_STOPS} strings of at most {MAX_STOP_LEN} characters")
    return [s for s in v if s]


@dataclass
class Plan:
    """Everything one request needs once validated: per-choice prompts, the
    engine parameters shared by all, and the worker-side options."""

    prompts: list[list[int]]
    params: dict
    stops: list[str]
    stream: bool = False
    n_probs: int = 0
    post_probs: bool = False
    return_tokens: bool = False
    grammar: bytes = b""
    bias: list[tuple[int, float]] = field(default_factory=list)
    settings: dict = field(default_factory=dict)  # generation_settings
    include_usage: bool = False
    top_logprobs: int = 0  # OpenAI: entries to show per token
    options: dict = field(default_factory=dict)  # the worker-side rows of ipc/params.py (verbose, ...)
    progress: bool = False  # stream prompt_progress events (return_progress)
    per_token: bool = False  # timings on every streamed event (timings_per_token)
    tools: bool = False  # the answer is parsed for tool calls (frontends/text/tools.py)
    answer: object = None  # with tools: a factory of the answer's parser (tools.answerer)
    think: object = None  # frontends/text/reasoning.py Think: the answer's reasoning is split out (None: no markers)
    order: str = chainhdr.ORDER  # the sampler chain's stages (``samplers``), ipc/chain.py chars
    breakers: tuple = chainhdr.BREAKERS  # DRY's sequence breakers

    @property
    def chain(self) -> bytes:
        """ipc/chain.py's header, first in the grammar area where the request
        changed the order or the breakers (b"": llama-server's defaults)."""
        if self.order == chainhdr.ORDER and tuple(self.breakers) == chainhdr.BREAKERS:
            return b""
        return chainhdr.pack(self.order, self.breakers)


def schema_grammar(schema) -> str:
    """GBNF for a JSON schema (llama-cpp-python's converter), or a 400 when
    the converter would ignore part of it (frontends/text/schemas.py)."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    schema = enforceable(schema)
    try:
        return json_schema_to_gbnf(json.dumps(schema))
    except Exception as e:  # the converter raises assorted types on bad schemas
        raise bad(f"failed to convert json_schema to a grammar: {e}") from None


def json_grammar() -> str:
    from llama_cpp.llama_grammar import JSON_GBNF

    return JSON_GBNF


# what strtol(key, &end, 10) reads whole (*end == 0): spaces, a sign, digits; "" too (0, end at the NUL)
_STRTOL = re.compile(r"[ \t\n\v\f\r]*[+-]?[0-9]+|")


def logit_bias(body: dict, vocab) -> list[tuple[int, float]]:
    """llama-server's logit_bias (server-schema.cpp): [[id|string, bias|false],
    ...] or {"id|string": bias|false}; a string biases each of its tokens,
    false bans (-inf). As there, an entry that is not one of these (a bias
    that is no number, an id out of the vocabulary, a malformed pair) is
    skipped, and a value that is neither an array nor an object is ignored;
    an object key is an id only where strtol reads it whole (" 15" is 15,
    "1_5" is text). More than MAX_BIAS entries (the record's room) is a 400."""
    v = body.get("logit_bias")
    if isinstance(v, dict):
        items = list(v.items())
    elif isinstance(v, list):
        items = [tuple(e) for e in v if isinstance(e, list) and len(e) == 2]
    else:
        return []
    out = []
    for key, b in items:
        if b is False:
            b = -math.inf
        elif isinstance(b, bool) or not isinstance(b, (int, float)) or math.isnan(b):
            continue
        if isinstance(v, dict):
            ids = [int(key or 0)] if _STRTOL.fullmatch(key) else vocab.tokenize(key, False, False)
        elif isinstance(key, str):
            ids = vocab.tokenize(key, False, False)
        elif isinstance(key, int) and not isinstance(key, bool):
            ids = [key]
        else:
            continue
        out += [(t, float(b)) for t in ids if vocab.valid(t)]
    if len(out) > MAX_BIAS:
        raise bad(f"Field 'logit_bias': at most {MAX_BIAS} entries")
    return out


def prompts(vocab, p) -> list[list[int]]:
    """llama-server's prompt forms: a string, token ids, ids mixed with
    strings (one prompt), or an array of those (one completion each)."""
    def one(x) -> list[int]:
        if isinstance(x, str):
            return vocab.tokenize(x, True, True)
        if isinstance(x, dict):
            if x.get("multimodal_data"):
                raise bad("multimodal prompts are not supported")
            s = x.get("prompt_string")
            if not isinstance(s, str):
                raise bad("prompt object needs a 'prompt_string'")
            return vocab.tokenize(s, True, True)
        if isinstance(x, list):
            ids: list[int] = []
            for i, e in enumerate(x):
                if isinstance(e, str):
                    ids += vocab.tokenize(e, i == 0, True)
                elif isinstance(e, int) and not isinstance(e, bool):
                    if not vocab.valid(e):
                        raise bad(f"token id {e} out of range 0..{vocab.n_vocab - 1}")
                    ids.append(e)
                else:
                    raise bad("prompt arrays hold token ids and strings only")
            return ids
        raise bad("'prompt' must be a string, an array of token ids, or an array of prompts")

    if p is None:
        raise bad("'prompt' is required")
    if isinstance(p, list) and p and not any(isinstance(e, int) and not isinstance(e, bool) for e in p):
        out = [one(e) for e in p]  # an array of prompts
    else:
        out = [one(p)]
    for ids in out:
        if not ids:
            raise bad("The prompt is empty")
    return out


def value(ctx, body: dict, row: Param):
    """One table row's validated value, in the record's units, read as
    llama-server's field_num reads it (frontends/text/fields.py get_num: the
    record type's conversion, ``soft`` clamps, hard bounds refuse); a ``loose``
    row's wrong type is its default, ``wrap`` takes the slot modulo n_slots,
    ``cap`` bounds the record; the default when absent (or ``same``)."""
    default = getattr(ctx.cfg, row.default.field) if isinstance(row.default, Cfg) else row.default
    keys = (row.name,) + row.aliases
    if row.kind is bool:
        return get_bool(body, row.name, default)
    if row.loose and not isinstance(pick(body, *keys)[1], (int, float, type(None))):
        return default  # json_value: a wrong type is the default, not an error
    v = get_num(body, keys, default, row.code, row.lo, row.hi, row.soft)
    if row.wrap == "slots" and v != -1:
        v = v % 2**64 % ctx.n_slots  # get_slot_by_id: id_slot % slots.size(), the int made a size_t
    if row.same is not None and v == row.same:
        v = default
    if row.floor is not None and v < row.floor:
        v = default
    if row.cap is not None:
        v = max(0, min(v, row.cap))
    return v & U32 if row.code == "<u4" else v


def sampler_order(body: dict, default: str = chainhdr.ORDER) -> str:
    """``samplers`` as llama-server's handler reads it: an array of names
    (case-insensitive, aliases as common_sampler_types_from_names) or a
    string of sampler chars; an unknown name or char is skipped (llama.cpp
    logs a warning), another type leaves the default order."""
    v = body.get("samplers")
    if isinstance(v, list):
        if not all(isinstance(x, str) for x in v):
            raise bad("Field 'samplers': expected an array of strings")
        return chainhdr.from_names(v)
    if isinstance(v, str):
        return chainhdr.from_chars(v)
    return default


def dry_breakers(body: dict, default: tuple = chainhdr.BREAKERS) -> tuple[str, ...]:
    """``dry_sequence_breakers``: a non-empty array of strings (llama-server's
    400 otherwise); absent or null: the server's (--dry-sequence-breaker)."""
    v = body.get("dry_sequence_breakers")
    if v is None:
        return tuple(default)
    if not (isinstance(v, list) and v and all(isinstance(x, str) for x in v)):
        raise bad("Error: dry_sequence_breakers must be a non-empty array of strings")
    return tuple(v)  # how many fit: the grammar area's bound (plan)


def probs_alias(body: dict) -> None:
    """llama-server's native schema reads ``logprobs`` as ``n_probs`` where
    ``n_probs`` is not given (server-schema.cpp's alias: /completion and
    /v1/completions, and chat when its ``logprobs`` is not OpenAI's
    boolean; the n_probs row reads the number, a string is a 400 there)."""
    if body.get("logprobs") is not None and body.get("n_probs") is None:
        body["n_probs"] = get_num(body, "logprobs", 0)  # int32, no limit: the n_probs row caps it


def plan(ctx, body: dict, prompt_ids: list[list[int]]) -> Plan:
    """Validate the sampling and output fields shared by every endpoint."""
    p = {row.name: value(ctx, body, row) for row in RECORD}
    options = {row.name: value(ctx, body, row) for row in PARAMS_TABLE if not row.field and row.check}
    grammar = get_str(body, "grammar")
    schema = body.get("json_schema")
    if schema is not None:
        if grammar:
            raise bad("Either \"json_schema\" or \"grammar\" can be specified, but not both")
        grammar = schema_grammar(schema)
    g = grammar.encode()
    if g.startswith(LAZY_GRAMMAR) and not isinstance(grammar, Lazy):
        # a request's own grammar never reaches the engine as a lazy one: its trigger regexes are compiled
        # by llama.cpp, whose exceptions (a bad regex, a trigger the grammar then refuses) abort the engine
        g = b"\n" + g  # still the same GBNF (its first line a comment), no longer the header
    if b"\0" in g:  # GBNF has none; the engine reads a NUL-led grammar area as a budget header (ipc/budget.py)
        raise bad("failed to parse grammar: a NUL byte")
    if len(g) > MAX_GRAMMAR:
        raise bad(f"grammar longer than {MAX_GRAMMAR} bytes")
    stops = get_stops(body)
    pl = Plan(prompts=prompt_ids, params=p, stops=stops, stream=get_bool(body, "stream", False),
              n_probs=p["n_probs"], post_probs=p["post_sampling_probs"],
              return_tokens=get_bool(body, "return_tokens", False), grammar=g, bias=logit_bias(body, ctx.vocab),
              options=options, order=sampler_order(body, ctx.cfg.samplers),
              breakers=dry_breakers(body, ctx.cfg.dry_sequence_breakers))
    if len(pl.order) + 6 * len(pl.breakers) > MAX_GRAMMAR or len(pl.chain) + len(g) > MAX_GRAMMAR:
        raise bad(f"grammar, samplers and dry_sequence_breakers longer than {MAX_GRAMMAR} bytes")
    # the engine's progress records feed both options, and only streams show them
    pl.progress, pl.per_token = pl.stream and bool(p["return_progress"]), pl.stream and options["timings_per_token"]
    p["return_progress"] = int(pl.progress or pl.per_token)
    so = body.get("stream_options")
    if so is not None:
        if not isinstance(so, dict):
            raise bad("Field 'stream_options': expected an object")
        pl.include_usage = get_bool(so, "include_usage", False)
    eog = [int(t) for t in ctx.vocab.core.eog_ids] if p["ignore_eos"] else []
    pl.settings = settings(p, pl, eog, ",".join(ctx.spec_types))
    return pl


def grammar_settings(area: bytes) -> dict:
    """grammar, grammar_lazy and grammar_triggers as llama-server shows them:
    the GBNF without the headers ringserve puts ahead of it (a reasoning
    budget's, a lazy grammar's), whose trigger regexes show as llama.cpp's
    PATTERN triggers (type 2; llama-server may show a word trigger as type 1)."""
    try:
        _, g = unpack_budget(area)
        lazy, g = lazy_header(g)
    except ValueError:  # a user's grammar that only looks like one: the engine answers it (400)
        lazy, g = None, area
    trig = [{"type": 2, "value": x} for x in (lazy or {}).get("patterns", [])]
    return {"grammar": g.decode(errors="replace"), "grammar_lazy": lazy is not None, "grammar_triggers": trig}


def settings(p: dict, pl: Plan, eog: list[int] = (), spec: str = "none") -> dict:
    """generation_settings as llama-server's task_params::to_json shows them:
    every row of ipc/params.py (ignored ones at llama-server's default),
    then the fields with their own areas and what ringserve does not vary.
    ``logit_bias`` is llama-server's list of {bias, token} (a ban's -inf as
    null), ignore_eos's ban of every end-of-generation token ``eog`` last,
    as its params_from_json appends them. ``spec``: the server's chained
    drafters (llama-server's speculative.types); speculative.n_max / n_min /
    p_min are the request's rows (they showed llama-server's old defaults)."""
    out = {row.name: p[row.name] if row.field else pl.options.get(row.name, row.default)
           for row in GENERATION if row.shown}
    out.update({
        "dry_sequence_breakers": list(pl.breakers),
        "stop": pl.stops, "max_tokens": p["n_predict"], "stream": pl.stream,
        "logit_bias": [{"bias": None if math.isinf(b) else b, "token": t} for t, b in pl.bias]
        + [{"bias": None, "token": t} for t in eog],
        **grammar_settings(pl.grammar), "preserved_tokens": [], "chat_format": "Content-only",
        "reasoning_format": "none", "reasoning_in_content": False,
        "samplers": [chainhdr.NAMES[c] for c in pl.order],
        "speculative.types": spec,
        "lora": [],
    })
    return out
