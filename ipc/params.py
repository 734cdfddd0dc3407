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
A row with ``field=False`` is accepted and ignored (shown in
generation_settings at llama-server's default, never validated unless
``check``): llama-server itself ignores a field of the wrong type, so only
fields ringserve acts on are strict.

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
    lo: float | None = None  # inclusive bounds; None: the type's range
    hi: float | None = None  # "slots": n_slots - 1, known per server
    dtype: str = ""  # numpy code in PARAMS; "" = DTYPE[kind]
    field: bool = True  # False: accepted and ignored (not in the record)
    same: object = None  # a request value that also means "the default" (n_predict -1)
    cap: int | None = None  # larger valid values are clamped to this (n_probs)
    check: bool = False  # an ignored row validated anyway (400 on a bad value)
    shown: bool = True  # in generation_settings (llama-server's task_params::to_json has it)
    engine: str = ""  # how the engine uses it
    scope: str = ""  # "": a generation field (record, generation_settings); else the one endpoint family using it
    slot: bool = False  # shown in GET /slots' "params" (llama-server's slot params subset)
    echo: bool = False  # echoed in /v1/responses' response object (OpenAI's Response shape)

    @property
    def code(self) -> str:
        return self.dtype or DTYPE[self.kind]

    def schema(self, hi=None) -> dict:
        """The OpenAPI schema of the value (bounds as the validator checks them)."""
        out: dict = {"type": {int: "integer", float: "number", bool: "boolean"}[self.kind]}
        lo, top = self.lo, self.hi if self.hi != "slots" else hi
        if lo is not None:
            out["minimum"] = lo
        if top is not None:
            out["maximum"] = top
        return out


# Record order = table order within each size class (ipc/layout.py builds
# PARAMS from it); generation_settings shows every row.
PARAMS_TABLE: tuple[Param, ...] = (
    Param("n_predict", int, Cfg("n_predict"), ("max_completion_tokens", "max_tokens", "max_output_tokens"), -1, I32, same=-1,
          engine="tokens to generate; -1: until EOS / context full", slot=True),
    Param("temperature", float, Cfg("temp"), engine="temp_ext last in the chain; <= 0 = greedy", slot=True, echo=True),
    Param("top_k", int, Cfg("top_k"), engine="top_k sampler; 1 = greedy, <= 0 = off", slot=True),
    Param("top_p", float, Cfg("top_p"), (), 0.0, 1.0, engine="top_p sampler on unscaled logits", slot=True, echo=True),
    Param("min_p", float, Cfg("min_p"), (), 0.0, 1.0, engine="min_p sampler on unscaled logits", slot=True),
    Param("typical_p", float, 1.0, (), 0.0, 1.0, engine="typical sampler; < 1 takes the llama chain", slot=True),
    Param("repeat_penalty", float, 1.0, (), 0.0, engine="penalties sampler", slot=True),
    Param("repeat_last_n", int, 64, (), -1, engine="penalties window (-1: context, 0: off)", slot=True),
    Param("presence_penalty", float, 0.0, engine="penalties sampler", slot=True),
    Param("frequency_penalty", float, 0.0, engine="penalties sampler", slot=True),
    Param("seed", int, Cfg("seed"), (), -1, U32, dtype="<u4",
          engine="RNG seed; -1 is stored as 0xFFFFFFFF = random", slot=True),
    Param("n_probs", int, 0, (), 0, cap=MAX_PROBS, engine="top-n probabilities per token (PROB rows)", slot=True),
    Param("id_slot", int, -1, (), -1, "slots", engine="slot to run in (-1: the best free one)"),
    Param("cache_prompt", bool, Cfg("cache_prompt"), engine="reuse the slot's KV prefix"),
    Param("ignore_eos", bool, False, engine="-inf bias on every end-of-generation token"),
    Param("post_sampling_probs", bool, False, engine="probabilities after the sampler chain"),
    Param("backend_sampling", bool, Cfg("backend_sampling"),
          engine="sample on the device where the request allows it (engine/sampling/ondevice.py)"),
    Param("top_n_sigma", float, -1.0, engine="top_n_sigma sampler after the penalties (<= 0: off; on: llama chain)"),
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
    # accepted and ignored: llama-server's samplers ringserve does not run (shown at their defaults)
    Param("dynatemp_range", float, 0.0, field=False),
    Param("dynatemp_exponent", float, 1.0, field=False),
    Param("xtc_probability", float, 0.0, field=False),
    Param("xtc_threshold", float, 0.1, field=False),
    Param("dry_multiplier", float, 0.0, field=False),
    Param("dry_base", float, 1.75, field=False),
    Param("dry_allowed_length", int, 2, field=False),
    Param("dry_penalty_last_n", int, -1, field=False),
    Param("mirostat", int, 0, (), 0, 2, field=False, check=True),
    Param("mirostat_tau", float, 5.0, field=False),
    Param("mirostat_eta", float, 0.1, field=False),
    Param("n_keep", int, Cfg("keep"), (), -1, engine="context shift: prompt tokens kept (-1: all; + BOS)"),
    Param("n_discard", int, 0, (), 0, engine="context shift: tokens dropped per shift (0: half of the rest)"),
    Param("n_cache_reuse", int, Cfg("cache_reuse"), (), 0, shown=False,
          engine="smallest cached chunk reused by KV shifting past the common prefix (0: off)"),
    Param("min_keep", int, 0, field=False),
    # worker-side options (not in the record; validated, their values in Plan.options)
    Param("timings_per_token", bool, False, field=False, check=True,
          engine="worker: timings on every streamed event"),
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
# llama-server's default sampler order as generation_settings shows it ("samplers")
SAMPLERS = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")
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
