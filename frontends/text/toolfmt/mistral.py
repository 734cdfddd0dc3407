"""Mistral Nemo: content, then ``[TOOL_CALLS]`` and a JSON array of
``{"name", "arguments", "id"}`` objects (the id is the model's, nine
characters). A call is shown once its object is complete: its id comes last."""
from __future__ import annotations

import json

from .core import Call, Format, Msg, content_until, json_end
from .hermes import _WS

OPEN = "[TOOL_CALLS]"


class MistralNemo(Format):
    name = "Mistral Nemo"
    triggers = (OPEN,)

    @staticmethod
    def detect(src: str) -> bool:
        return OPEN in src and "[CALL_ID]" not in src and "[ARGS]" not in src

    def parse(self, text: str, final: bool = False) -> Msg:
        k = text.find(OPEN)
        content = content_until(text, 0, k if k >= 0 else None, [OPEN], final)
        if k < 0:
            return Msg(content)
        s, i = text, k + len(OPEN)
        while i < len(s) and s[i] in _WS:
            i += 1
        calls: list[Call] = []
        if i < len(s) and s[i] == "[":
            i += 1
            while True:
                while i < len(s) and s[i] in _WS + ",":
                    i += 1
                if i >= len(s) or s[i] != "{":
                    break
                e = json_end(s, i)
                if e is None:
                    break
                obj = json.loads(s[i:e])
                if isinstance(obj, dict) and isinstance(obj.get("name"), str):
                    calls.append(Call(obj["name"], _raw(s, i, e, "arguments"), str(obj.get("id") or "")))
                i = e
        return Msg(content, "", calls)


def _raw(s: str, i: int, e: int, key: str) -> str:
    """The model's own text of ``key``'s value in the object s[i:e]."""
    from frontends.text.toolparse import _Scan

    sc = _Scan()
    sc.s = s[:e]
    for k, v in sc.members(i):
        if k == key:
            return s[v:sc.end(v)]
    return "{}"
