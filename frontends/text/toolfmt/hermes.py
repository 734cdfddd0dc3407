"""Hermes 2 Pro / Hermes 3 / Qwen 2.5 / Qwen 3 / QwQ: content, then calls as
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` (parallel
calls follow each other, whitespace between). The arguments are the model's
own JSON text. The thoughts (``<think>``) are split off before (frontends/
text/reasoning.py): a call inside them is a thought."""
from __future__ import annotations

from frontends.text.toolparse import _Scan

from .core import Call, Format, Msg, content_until

_WS = " \t\r\n"


def json_calls(fmt: Format, body: str, opener: str, closer: str, args_key: str, final: bool) -> tuple[list[Call], str]:
    """Calls ``opener {json} closer`` one after another (whitespace between);
    returns them and the trailing text that is no call (content, kept only
    by a final parse: llama-server would refuse it)."""
    calls: list[Call] = []
    i = 0
    while True:
        j = i
        while j < len(body) and body[j] in _WS:
            j += 1
        if not body.startswith(opener, j):
            rest = body[i:]
            return calls, rest if final and rest.strip(_WS) else ""  # partial: it may become a call
        j += len(opener)
        while j < len(body) and body[j] in _WS:
            j += 1
        if j >= len(body) or body[j] != "{":
            return calls, body[i:] if final else ""
        sc = _Scan()
        sc.s = body
        name, args = None, ""
        for key, v in sc.members(j):
            if key == "name" and body[v] == '"':
                n, e = sc.string(v)
                name = n if e is not None else None
            elif key == args_key:
                e = sc.end(v)
                args = body[v:len(body) if e is None else e]
        if name is None:
            return calls, ""
        e = sc.end(j)
        calls.append(Call(name, args if e is not None else args.rstrip(_WS)))
        if e is None:
            return calls, ""
        k = body.find(closer, e)
        if k < 0:
            return calls, ""
        i = k + len(closer)


class Hermes(Format):
    name = "Hermes 2 Pro"
    opener, closer = "<tool_call>\n", "</tool_call>"
    triggers = ("<tool_call>\n",)

    @staticmethod
    def detect(src: str) -> bool:
        return "<tool_call>" in src

    def parse(self, text: str, final: bool = False) -> Msg:
        k = text.find(self.opener)
        content = content_until(text, 0, k if k >= 0 else None, [self.opener], final)
        if k < 0:
            return Msg(content)
        calls, tail = json_calls(self, text[k:], self.opener, self.closer, "arguments", final)
        return Msg(content + tail, "", calls)
