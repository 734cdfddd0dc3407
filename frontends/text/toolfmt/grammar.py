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

gpt-oss and Qwen3-Coder follow the vendored common/chat.cpp's PEG builders
(common/parsers/gpt-oss.cpp, qwen3-coder.cpp): their "auto" grammar is the
call alone behind llama-server's triggers (gpt-oss: its four regexes over
the harmony headers; Qwen3-Coder: ``<tool_call>`` and, for the coder
template that may drop it, ``<function=NAME>``), their "required" grammar
the whole answer. llama-server feeds the generation prompt
(``<|start|>assistant``, ``<|im_start|>assistant\n``) through a "required"
grammar first; ringserve's grammar starts after it, so its root is what
remains of llama-server's once that prefix is read. Llama 3.x "auto" has
none (llama-server's own is not lazy): free text parsed after the fact.
"""
from __future__ import annotations

import json
import re

from ipc.layout import LAZY_GRAMMAR

from frontends.text.errors import bad
from frontends.text.params import Lazy
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


def _args(i: int | str, params: dict) -> str:
    """The schema's grammar, its rules prefixed ``t{i}-`` (its root ``t{i}-root``)."""
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
    from .gptoss import GptOss
    from .hermes import Hermes
    from .llama3 import Llama3
    from .mistral import MistralNemo
    from .qwen3coder import Qwen3Coder

    if isinstance(fmt, (GptOss, Qwen3Coder)):
        g, patterns = (_gptoss if isinstance(fmt, GptOss) else _qwen3coder)(fmt, spec)
        return g if spec.required else Lazy(LAZY + json.dumps({"patterns": patterns}) + "\n" + g)
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
    return Lazy(LAZY + json.dumps({"patterns": [regex_escape(w) for w in fmt.triggers]}) + "\n" + g)


def regex_escape(word: str) -> str:
    """common.cpp's regex_escape: a WORD trigger as its pattern."""
    return _SPECIAL.sub(lambda m: "\\" + m.group(0), word)


# gpt-oss: common/parsers/gpt-oss.cpp's triggers, verbatim
GPTOSS_PATTERNS = ["^\\s+to$", "^<\\|channel\\|>(?:commentary|analysis)\\s+to=functions$",
                   "<\\|start\\|>assistant(\\s+to)", "<\\|start\\|>assistant(<\\|channel\\|>(?:commentary|analysis)\\s+to)"]


def _gptoss(fmt, spec) -> tuple[str, list[str]]:
    """A call with the recipient in the role header (`` to=functions.F<|channel|>...``)
    or in the channel header (``<|channel|>commentary to=functions.F...``);
    "required": any analysis / preamble messages first. One call (the
    vendored grammar has no parallel form)."""
    from .until import excluding

    chan, con = '"<|channel|>" ("commentary" | "analysis")', '(ws "<|constrain|>"? [A-Za-z0-9_-]+)?'
    alts, rules = _calls(spec, lambda i, name: (
        f'" to=functions." {_lit(name)} {chan} {con} "<|message|>" t{i}-root'
        f' | {chan} " to=functions." {_lit(name)} {con} "<|message|>" t{i}-root'))
    if not spec.required:
        return "\n".join([f"root ::= {alts}", *rules, WS]), list(GPTOSS_PATTERNS)
    body, until = excluding("until-end", ["<|end|>"])
    msgs = [f'analysis ::= ("<|channel|>commentary" " to=assistant"?)? "<|channel|>analysis<|message|>" {body} "<|end|>"',
            f'preamble ::= "<|channel|>commentary<|message|>" {body} "<|end|>"']
    # llama-server's root (start any)* start tool-call, its first "<|start|>assistant" in the prompt
    root = f'root ::= ((preamble | analysis) "<|start|>assistant")* ({alts})'
    return "\n".join([root, *msgs, *until, *rules, WS]), list(GPTOSS_PATTERNS)


def value_types(s) -> set[str]:
    """The JSON types a schema admits (json-schema.cpp value_types; "number" admits integers)."""
    every = {"string", "number", "integer", "boolean", "null", "array", "object"}
    if not isinstance(s, dict):
        return every
    if "const" in s:
        return {_json_type(s["const"])}
    if "enum" in s and isinstance(s["enum"], list):
        return {_json_type(v) for v in s["enum"]}
    for k in ("anyOf", "oneOf"):
        if isinstance(s.get(k), list):
            return set().union(*[value_types(c) for c in s[k]])
    if isinstance(s.get("allOf"), list):
        out = set(every)
        for c in s["allOf"]:
            out &= value_types(c)
        return out
    t = s.get("type")
    ts = set(t) if isinstance(t, list) else {t} if isinstance(t, str) else every
    return ts | ({"integer"} if "number" in ts else set())


def _json_type(v) -> str:
    if isinstance(v, bool):
        return "boolean"
    return {str: "string", int: "integer", float: "number", type(None): "null", list: "array"}.get(type(v), "object")


def _permute(prefix: str, parts: list[str]) -> tuple[str, list[str]]:
    """chat-peg-parser.cpp permute: the required arguments in any order (a
    rule per subset left; more than six: in order)."""
    if not parts:
        return "", []
    if len(parts) == 1 or len(parts) > 6:
        return " ".join(parts), []
    rules: dict[int, str] = {}

    def left(mask: int) -> str:
        if mask == 0:
            return ""
        if mask not in rules:
            alts = [(parts[i] + " " + left(mask & ~(1 << i))).strip() for i in range(len(parts)) if mask >> i & 1]
            rules[mask] = f"{prefix}-{mask} ::= " + " | ".join(alts)
        return f"{prefix}-{mask}"

    return left((1 << len(parts)) - 1), list(rules.values())


def _qwen3coder(fmt, spec) -> tuple[str, list[str]]:
    """``<tool_call>\\n<function=F>\\n<parameter=K>\\nV\\n</parameter>\\n...</function>\\n</tool_call>``:
    a string parameter is any text up to ``\\n</parameter>\\n``, another its
    schema's JSON; required parameters in any order, then optional ones.
    The coder template (no ``<think>``) may drop the first ``<tool_call>``."""
    from .until import excluding, including

    coder = "<think>" not in fmt.source
    starts = ["<tool_call>"] + ([f"<function={t['function']['name']}>" for t in spec.tools] if coder else [])
    xml, xml_rules = including("xml-arg-string", ["\n</parameter>\n"])
    rules = [*xml_rules]
    for i, t in enumerate(spec.tools):
        f = t["function"]
        params = f.get("parameters") or {}
        need = set(params.get("required") or [])
        req, opt = [], []
        for j, (k, ps) in enumerate((params.get("properties") or {}).items()):
            if "string" in value_types(ps):
                value = xml
            else:
                rules.append(_args(f"{i}-a{j}", ps))
                value = f't{i}-a{j}-root "\\n</parameter>\\n"'
            rules.append(f't{i}-arg{j} ::= "<parameter=" {_lit(k)} ">\\n" {value}')
            (req if k in need else opt).append(f"t{i}-arg{j}")
        args, perm = _permute(f"t{i}-args", req)
        rules += perm
        body = [f'"<function=" {_lit(f["name"])} ">\\n"', args, f"({' | '.join(opt)})*" if opt else "", '"</function>\\n"']
        rules.append(f"t{i}-call ::= " + " ".join(x for x in body if x))
    alts = " | ".join(f"t{i}-call" for i in range(len(spec.tools)))
    rules.append(f'tc ::= "<tool_call>\\n" ({alts}) "</tool_call>" ws')
    rules.append(f'tc-first ::= "<tool_call>\\n"? ({alts}) "</tool_call>" ws' if coder else "tc-first ::= tc")
    calls = "tc-first tc*" if spec.parallel else "tc-first"
    if spec.required:
        # llama-server's root "<|im_start|>assistant\\n" [thoughts] space until space calls, the
        # prefix in the prompt; the thoughts are text the "until" admits, so they need no rule here
        body, until = excluding("until-call", starts)
        root, rules = f"root ::= ws {body} ws ({calls})", [*until, *rules]
    else:
        root = f"root ::= ({calls})?"
    return "\n".join([root, *rules, WS]), [regex_escape(w) for w in starts]
