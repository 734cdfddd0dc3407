"""Qwen3-Coder XML (also Qwen 3.5, Nemotron Nano 3): content, then calls as
``<tool_call>\\n<function=NAME>\\n<parameter=K>\\nV\\n</parameter>\\n...
</function>\\n</tool_call>`` (the first may lack ``<tool_call>``). The
arguments become compact JSON (llama-server's ``{"k":v}``), each value typed
by the tool's schema: a string parameter keeps its text, anything else is
parsed as JSON (its text where that fails)."""
from __future__ import annotations

import json

from .core import Call, Format, Msg, content_until, held

TC, FN, PAR, EPAR, EFN = "<tool_call>", "<function=", "<parameter=", "</parameter>", "</function>"


def _dump(v) -> str:
    return json.dumps(v, ensure_ascii=False, separators=(",", ":"))


class Qwen3Coder(Format):
    name = "Qwen3-Coder"
    triggers = (TC, FN)

    def __init__(self, source: str = "", tools: list[dict] | None = None):
        super().__init__(source)
        self.types: dict[tuple[str, str], str] = {}
        self.set_tools(tools or [])

    def set_tools(self, tools: list[dict]) -> None:
        self.types = {}
        for t in tools:
            f = t.get("function", {})
            for k, p in (f.get("parameters") or {}).get("properties", {}).items():
                self.types[(f.get("name"), k)] = p.get("type", "string") if isinstance(p, dict) else "string"

    @staticmethod
    def detect(src: str) -> bool:
        return (TC in src and FN in src and PAR in src
                and "'<tool_call><function=' ~ tool_call.name ~ '>'" not in src)

    def _value(self, fn: str, key: str, raw: str) -> str:
        if self.types.get((fn, key), "string") == "string":
            return _dump(raw)
        try:
            return _dump(json.loads(raw))
        except ValueError:
            return _dump(raw)

    def parse(self, text: str, final: bool = False) -> Msg:
        k = text.find(TC)
        f = text.find(FN)
        k = f if k < 0 or 0 <= f < k and not text[k:f].strip() == "" else k
        k = min(x for x in (text.find(TC), f) if x >= 0) if (text.find(TC) >= 0 or f >= 0) else -1
        content = content_until(text, 0, k if k >= 0 else None, self.triggers, final)
        if k < 0:
            return Msg(content)
        m, s, i = Msg(content), text, k
        while True:
            j = s.find(FN, i)
            if j < 0 or s[i:j].replace(TC, "").strip():
                break
            g = s.find(">", j)
            if g < 0:
                break
            name = s[j + len(FN):g]
            args, i = "{", g + 1
            call = Call(name, "")
            m.calls.append(call)
            first = True
            while True:
                p = s.find(PAR, i)
                ef = s.find(EFN, i)
                if ef >= 0 and (p < 0 or ef < p):
                    call.arguments = args + "}"
                    i = ef + len(EFN)
                    break
                if p < 0:
                    call.arguments = args
                    return m
                g = s.find(">", p)
                if g < 0:
                    call.arguments = args
                    return m
                key = s[p + len(PAR):g]
                v0 = g + 1 + (s.startswith("\n", g + 1))
                e = s.find(EPAR, v0)
                head = args + ("" if first else ",") + _dump(key) + ":"
                if e < 0:
                    if self.types.get((name, key), "string") == "string":
                        raw = s[v0:]
                        raw = raw[:len(raw) - held(raw, [EPAR])]
                        raw = raw[:-1] if raw.endswith("\n") else raw
                        call.arguments = head + _dump(raw)[:-1]
                    else:
                        call.arguments = args
                    return m
                raw = s[v0:e]
                raw = raw[:-1] if raw.endswith("\n") else raw
                args, first, i = head + self._value(name, key, raw), False, e + len(EPAR)
            c = s.find(TC, i)
            if c < 0:
                break
            i = c + len(TC)
        return m
