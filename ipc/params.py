"""Every request parameter of the generation endpoints, declared once.

One row per llama-server request field (server-schema.cpp params_from_json,
task_params::to_json). From this table come: the channel's PARAMS record
(ipc/layout.py), the engine's defaults (engine/sampling/ DEFAULTS,
Config.sampling), the frontends' validation and error messages
(frontends/text/params.py), ``generation_settings`` and /props'
``default_generation_settings``, the /openapi.json request schema
(frontends/api/openapi.py) and the engine's checks when it reads a request
(ipc/channel.py read_request).

A new parameter is one row here plus its sampler code in engine/sampling/.
A number is read as llama-server's field_num reads it (server-schema.h:
nlohmann's ``get<T>`` for the row's record type, then server-schema.cpp
field_num::eval's limits): a float is truncated for an integer row, a
boolean is 0/1, an integer wraps to 32 bits (seed, a uint32: -2 is
0xFFFFFFFE); ``soft`` rows clamp into lo..hi (set_limits), the others
refuse a value outside (set_hard_limits: 400 "Value must be between");
no bounds: any value of the type. A string, array or object is a 400
(get<T> throws), except on a ``loose`` row (llama-server's json_value: the
default).

A row with ``field=False`` is accepted and ignored (shown in
generation_settings at llama-server's default, never validated unless
``check``, which rows llama-server reads with field_num carry: their
wrong types and hard limits are 400s there too, their value is shown).

This module is the lowest layer (no numpy, no llama_cpp): engine, workers,
tests and scripts all import it.
"""
from __future__ import annotations

from dataclasses import dataclass

I32 = 2**31 - 1
U32 = 2**32 - 1
F32 = 3.4e38
SEED_RANDOM = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: the engine draws a random seed
MAX_PROBS = 20  # top-n probabilities a token record carries (ipc/layout.py PROB rows)

DTYPE = {int: "<i4", float: "<f4", bool: "u1"}


@dataclass(frozen=True)
class Cfg:
    """A default taken from a server setting (engine/config.py field)."""

    field: str


@dataclass(frozen=True)
class Param:
    name: str  # request key, PARAMS field and generation_settings key
    kind: type  # int | float | bool
    default: object  # llama-server's literal default, or Cfg("field") = the server's --flag
    aliases: tuple[str, ...] = ()  # further request keys, OpenAI's included; the first present wins
    lo: float | None = None  # inclusive bounds; None: the type's range (floats: +-FLT_MAX, as field_num's)
    hi: float | None = None
    soft: bool = False  # llama-server's set_limits: a value outside lo..hi is clamped into them; False: a 400
    dtype: str = ""  # numpy code in PARAMS; "" = DTYPE[kind]
    field: bool = True  # False: accepted and ignored (not in the record)
    same: object = None  # a request value that also means "the default" (n_predict -1)
    cap: int | None = None  # the record holds 0..cap (ringserve's PROB rows): larger is cap, negative 0 = off
    loose: bool = False  # read as json_value reads it: a value of the wrong type is the default (id_slot)
    wrap: str = ""  # "slots": a value other than -1 is taken modulo n_slots as a size_t (get_slot_by_id)
    check: bool = False  # an ignored row validated anyway (400 on a bad value)
    shown: bool = True  # in generation_settings (llama-server's task_params::to_json has it)
    engine: str = ""  # how the engine uses it
    scope: str = ""  # "": a generation field (record, generation_settings); else the one endpoint family using it
    slot: bool = False  # shown in GET /slots' "params" (llama-server's slot params subset)
    echo: bool = False  # echoed in /v1/responses' response object (OpenAI's Response shape)
    floor: float | None = None  # a value below this is the default (llama-server's dry_base handler)

    @property
    def code(self) -> str:
        return self.dtype or DTYPE[self.kind]

    def schema(self, hi=None) -> dict:
        """The OpenAPI schema of the value (hard bounds as the validator checks them;
        a soft row's bounds are no refusal: its description says them)."""
        out: dict = {"type": {int: "integer", float: "number", bool: "boolean"}[self.kind]}
        if self.soft:
            out["description"] = f"clamped into {self.lo if self.lo is not None else '-inf'}.." \
                                 f"{self.hi if self.hi is not None else 'inf'}"
            return out
        if self.lo is not None:
            out["minimum"] = self.lo
        if self.hi is not None:
            out["maximum"] = self.hi
        return out


# Record order = table order within each size class (ipc/layout.py builds
# PARAMS from it); generation_settings shows every row.
PARAMS_TABLE: tuple[Param, ...] = (
    Param("n_predict", int, Cfg("n_predict"), ("max_completion_tokens", "max_tokens", "max_output_tokens"), -1, I32, same=-1,
          engine="tokens to generate; -1: until EOS / context full", slot=True),
    Param("temperature", float, Cfg("temp"), (), 0.0, soft=True, engine="temp_ext last in the chain; <= 0 = greedy", slot=True, echo=True),
    Param("top_k", int, Cfg("top_k"), (), 0, soft=True, engine="top_k sampler; 1 = greedy, <= 0 = off", slot=True),
    Param("top_p", float, Cfg("top_p"), (), 0.0, 1.0, soft=True, engine="top_p sampler on unscaled logits", slot=True, echo=True),
    Param("min_p", float, Cfg("min_p"), (), 0.0, 1.0, soft=True, engine="min_p sampler on unscaled logits", slot=True),
    Param("typical_p", float, Cfg("typical_p"), engine="typical sampler; < 1 takes the llama chain", slot=True),
    Param("repeat_penalty", float, Cfg("repeat_penalty"), engine="penalties sampler", slot=True),
    Param("repeat_last_n", int, Cfg("repeat_last_n"), (), 0, engine="penalties window (0: off)", slot=True),
    Param("presence_penalty", float, Cfg("presence_penalty"), engine="penalties sampler", slot=True),
    Param("frequency_penalty", float, Cfg("frequency_penalty"), engine="penalties sampler", slot=True),
    Param("seed", int, Cfg("seed"), dtype="<u4",
          engine="RNG seed, a uint32 (-1 is 0xFFFFFFFF = random)", slot=True),
    Param("n_probs", int, 0, cap=MAX_PROBS, engine="top-n probabilities per token (PROB rows)", slot=True),
    Param("id_slot", int, -1, loose=True, wrap="slots", engine="slot to run in (-1: the best free one)"),
    Param("cache_prompt", bool, Cfg("cache_prompt"), engine="reuse the slot's KV prefix"),
    Param("ignore_eos", bool, Cfg("ignore_eos"), engine="-inf bias on every end-of-generation token"),
    Param("post_sampling_probs", bool, False, engine="probabilities after the sampler chain"),
    Param("backend_sampling", bool, Cfg("backend_sampling"),
          engine="sample on the device where the request allows it (engine/sampling/ondevice.py)"),
    Param("top_n_sigma", float, Cfg("top_n_sigma"), slot=True,
          engine="top_n_sigma sampler after the penalties (<= 0: off; on: llama chain)"),
    # speculative decoding (engine/spec/): the draft model's n_max / n_min / p_min, as llama-server's
    # server-schema.cpp rows (compiled out in the vendored version); n_max 0 turns speculation off for the request
    Param("speculative.n_max", int, Cfg("spec_draft_n_max"), (), 0, I32,
          engine="draft-model tokens per draft (0: no speculation for this request)"),
    Param("speculative.n_min", int, Cfg("spec_draft_n_min"), (), 0, I32,
          engine="a draft shorter than this is not verified"),
    Param("speculative.p_min", float, Cfg("spec_draft_p_min"), (), 0.0, 1.0,
          engine="the draft model stops at a token below this probability"),
    Param("return_progress", bool, False, shown=False,
          engine="publish F_PROGRESS records (prompt_progress; the workers also ask for timings_per_token)"),
    # the llama chain's other stages (engine/sampling/chain.py; any of them on takes the request off the fast paths)
    Param("dynatemp_range", float, Cfg("dynatemp_range"), slot=True,
          engine="temp_ext's range: > 0 scales the temperature by the entropy (llama chain)"),
    Param("dynatemp_exponent", float, Cfg("dynatemp_exponent"), slot=True,
          engine="temp_ext's exponent (with dynatemp_range)"),
    Param("xtc_probability", float, Cfg("xtc_probability"), (), 0.0, 1.0, soft=True, slot=True,
          engine="xtc sampler: chance of removing the top tokens above xtc_threshold (0: off)"),
    Param("xtc_threshold", float, Cfg("xtc_threshold"), (), 0.0, 1.0, soft=True, slot=True,
          engine="xtc sampler's threshold (> 0.5: off)"),
    Param("dry_multiplier", float, Cfg("dry_multiplier"), slot=True, engine="DRY repetition penalty (0: off)"),
    # llama-server's own handler puts a dry_base below 1 back to the server's default: not a 400
    Param("dry_base", float, Cfg("dry_base"), floor=1.0, slot=True, engine="DRY penalty base"),
    Param("dry_allowed_length", int, Cfg("dry_allowed_length"), (), 0, slot=True,
          engine="DRY: repeats up to this long are free"),
    Param("dry_penalty_last_n", int, Cfg("dry_penalty_last_n"), (), 0, slot=True,
          engine="DRY window (0: off; at most the slot's context)"),
    Param("mirostat", int, Cfg("mirostat"), (), 0, 2, soft=True, slot=True,
          engine="1 or 2: temperature then mirostat replace the chain"),
    Param("mirostat_tau", float, Cfg("mirostat_tau"), slot=True, engine="mirostat's target entropy"),
    Param("mirostat_eta", float, Cfg("mirostat_eta"), slot=True, engine="mirostat's learning rate"),
    Param("adaptive_target", float, Cfg("adaptive_target"), (), -F32, 1.0, soft=True, slot=True,
          engine="adaptive_p's target (used when the samplers order names adaptive_p)"),
    Param("adaptive_decay", float, Cfg("adaptive_decay"), (), 0.0, 0.99, slot=True, engine="adaptive_p's EMA decay"),
    Param("n_keep", int, Cfg("keep"), (), -1, engine="context shift: prompt tokens kept (-1: all; + BOS)"),
    Param("n_discard", int, 0, (), 0, engine="context shift: tokens dropped per shift (0: half of the rest)"),
    Param("n_cache_reuse", int, Cfg("cache_reuse"), (), 0, shown=False,
          engine="smallest cached chunk reused by KV shifting past the common prefix (0: off)"),
    Param("min_keep", int, 0, (), 0,
          engine="top_p, min_p and typical keep at least this many tokens (llama.cpp's min_keep; > 1: the llama chain)",
          slot=True),
    # worker-side options (not in the record; validated, their values in Plan.options)
    Param("timings_per_token", bool, False, field=False, check=True,
          engine="worker: timings on every streamed event"),
    Param("t_max_predict_ms", int, -1, (), -1, field=False, check=True, shown=False,
          engine="worker: a newline past this many ms since the first token stops the answer (limit; FIM clients)"),
    Param("n_indent", int, 0, (), 0, I32, field=False, check=True, shown=False,
          engine="worker: a line that starts less indented than this stops the answer there (limit; FIM clients)"),
    Param("sse_ping_interval", int, Cfg("sse_ping_interval"), (), -1, I32, field=False, check=True, shown=False,
          engine="worker: seconds of engine silence in a stream, after its first event, before an SSE comment "
                 "ping (<= 0: none); default --sse-ping-interval"),
    Param("verbose", bool, Cfg("verbose"), field=False, check=True, shown=False,
          engine="worker: __verbose (the native result) in OpenAI-compatible answers; default --verbose"),
    # tool calling (worker-side, frontends/text/tools.py; tools and tool_choice are structured: validated there)
    Param("parallel_tool_calls", bool, False, field=False, check=True, shown=False,
          engine="worker: the {\"tool_calls\": [...]} form of the generic tool-call grammar (llama-server's default false)"),
    # reasoning (worker-side, frontends/text/reasoning.py; the budget reaches the engine as ipc/budget.py's header)
    Param("reasoning_budget_tokens", int, Cfg("reasoning_budget"), ("thinking_budget_tokens",), -1, field=False,
          check=True, engine="worker: thinking tokens before the end marker is forced (-1: unlimited; "
                             "engine/sampling/budget.py); default --reasoning-budget"),
    # fields of other endpoints (frontends/api/embed.py): validated here, never in the record or generation_settings
    Param("embd_normalize", int, Cfg("embd_normalize"), (), -1, field=False, scope="embeddings",
          engine="worker: normalisation of a pooled vector (-1 none, 0 max-abs int16, 1 taxicab, 2 euclid, >2 p-norm)"),
    Param("top_n", int, I32, (), 0, field=False, scope="rerank", engine="worker: results kept (best first)"),
)
RECORD = tuple(p for p in PARAMS_TABLE if p.field)  # the rows the PARAMS record carries
GENERATION = tuple(p for p in PARAMS_TABLE if not p.scope)  # the generation endpoints' rows
BY_NAME = {p.name: p for p in PARAMS_TABLE}
SLOT = tuple(p for p in PARAMS_TABLE if p.slot)  # GET /slots' params, in table order
ECHO = tuple(p.name for p in PARAMS_TABLE if p.echo)  # the Responses API's echoed sampling fields
FLOATS = tuple(p.name for p in RECORD if p.kind is float)  # the engine rejects non-finite ones


def defaults(cfg, **overrides) -> dict:
    """The record's values for a request that gives none: llama-server's
    literals, the server's flags (``cfg``, an engine Config) where a row says
    Cfg, in PARAMS units (bools as 0/1, seed as u32)."""
    out = {}
    for p in RECORD:
        v = getattr(cfg, p.default.field) if isinstance(p.default, Cfg) else p.default
        out[p.name] = int(v) if p.kind is bool else v
    out["seed"] = out["seed"] & U32
    out.update(overrides)
    return out
