"""Grammars for the native formats, as llama-server builds them: with
tool_choice "auto" a *lazy* grammar -- the model writes freely until the
format's trigger (``<tool_call>\\n``, ``[TOOL_CALLS]``,
``<｜tool▁calls▁begin｜>``) appears, then the grammar holds the rest to the
tools' schemas; with "required" (or a named function) the same calls from
the first token.

A lazy grammar travels in the request's ordinary grammar area (ipc rows
unchanged): its first line is the GBNF comment ``# lazy: {"patterns": [...]}``
(the trigger regexes, common/sampling.cpp's regex_escape of each word),
which engine/sampling/chain.py reads to build
``llama_sampler_init_grammar_lazy_patterns``; the rest is plain GBNF.

Formats without a grammar here (Llama 3.x "auto": llama-server's own is not
lazy; gpt-oss; Qwen3-Coder XML) leave "auto" as free text parsed after the
fact; their "required" is free text too (see docs/ARCHITECTURE.md).
"""
from __future__ import annotations

import json
import re

from ipc.layout import LAZY_GRAMMAR

from frontends.text.errors import bad
from frontends.text.schemas import enforceable

LAZY = LAZY_GRAMMAR.decode()
_SPECIAL = re.compile(r"[.^$|()*+?\[\]{}\\]")
WS = 'ws ::= | " " | "\\n"{1,2} [ \\t]{0,20}'
_SEG = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|[A-Za-z0-9_-]+|.', re.S)


def _lit(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def _prefixed(gbnf: str, p: str) -> str:
    """A converter's grammar with every rule name prefixed (``root`` -> ``p-root``)."""
    names = {ln.split("::=", 1)[0].strip() for ln in gbnf.splitlines() if "::=" in ln}
    out = []
    for ln in gbnf.splitlines():
        out.append("".join(f"{p}-{t}" if t in names else t for t in _SEG.findall(ln)))
    return "\n".join(out)


def _args(i: int, params: dict) -> str:
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        return _prefixed(json_schema_to_gbnf(json.dumps(enforceable(params))), f"t{i}")
    except Exception as e:  # noqa: BLE001 -- the converter raises assorted types
        raise bad(f"failed to convert the tools to a grammar: {e}") from None


def _calls(spec, call) -> tuple[str, list[str]]:
    """(alternatives over the tools, rules): ``call(i, name)`` is one tool's call rule body."""
    rules = []
    for i, t in enumerate(spec.tools):
        f = t["function"]
        rules.append(_args(i, f["parameters"]))
        rules.append(f"t{i}-call ::= " + call(i, f["name"]))
    return " | ".join(f"t{i}-call" for i in range(len(spec.tools))), rules


def _json_call(args_key: str, id_key: bool = False):
    def call(i: int, name: str) -> str:
        s = (f'"{{" ws "\\"name\\"" ws ":" ws {_lit(_lit(name))} ws "," ws "\\"{args_key}\\"" ws ":" ws t{i}-root')
        if id_key:
            s += ' ws "," ws "\\"id\\"" ws ":" ws "\\"" [a-zA-Z0-9]{9} "\\""'
        return s + ' ws "}"'
    return call


def _hermes(spec, opener: str, closer: str) -> str:
    alts, rules = _calls(spec, _json_call("arguments"))
    one = f"{_lit(opener)} ws ({alts}) ws {_lit(closer)}"
    root = f"root ::= tc (ws tc)*\ntc ::= {one}" if spec.parallel else f"root ::= {one}"
    return "\n".join([root, *rules, WS])


def _mistral(spec) -> str:
    alts, rules = _calls(spec, _json_call("arguments", id_key=True))
    more = f' (ws "," ws ({alts}))*' if spec.parallel else ""
    return "\n".join([f'root ::= "[TOOL_CALLS]" "[" ws ({alts}){more} ws "]"', *rules, WS])


def _deepseek(spec) -> str:
    from .deepseek import CALL, CALLS, END, SEP

    alts, rules = _calls(spec, lambda i, name: f'{_lit(CALL + "function" + SEP + name + chr(10) + "```json" + chr(10))} '
                                               f't{i}-root ws {_lit("```" + END)}')
    more = f" (ws ({alts}))*" if spec.parallel else ""
    return "\n".join([f'root ::= {_lit(CALLS)} ({alts}){more} ws {_lit("<｜tool▁calls▁end｜>")}', *rules, WS])


def _llama3(spec) -> str:
    alts, rules = _calls(spec, _json_call("parameters"))
    return "\n".join([f"root ::= {alts}", *rules, WS])


def build(fmt, spec) -> str:
    """The request's grammar ("" where the format has none here)."""
    from .deepseek import DeepSeekR1
    from .hermes import Hermes
    from .llama3 import Llama3
    from .mistral import MistralNemo

    if isinstance(fmt, Hermes):
        g = _hermes(spec, fmt.opener, fmt.closer)
    elif isinstance(fmt, MistralNemo):
        g = _mistral(spec)
    elif isinstance(fmt, DeepSeekR1):
        g = _deepseek(spec)
    elif isinstance(fmt, Llama3) and spec.required:
        return _llama3(spec)
    else:
        return ""
    if spec.required:
        return g
    return LAZY + json.dumps({"patterns": [regex_escape(w) for w in fmt.triggers]}) + "\n" + g


def regex_escape(word: str) -> str:
    """common.cpp's regex_escape: a WORD trigger as its pattern."""
    return _SPECIAL.sub(lambda m: "\\" + m.group(0), word)
