"""DeepSeek R1 (and its distills): thoughts (the generation prompt opens
``<think>``; frontends/text/reasoning.py splits them off first), content, then ``<｜tool▁calls▁begin｜>`` and calls as
``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\nARGS```<｜tool▁call▁end｜>``."""
from __future__ import annotations

from .core import Call, Format, Msg, content_until, json_end
from .hermes import _WS

CALLS = "<｜tool▁calls▁begin｜>"
CALL, SEP, END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"


class DeepSeekR1(Format):
    name = "DeepSeek R1"
    triggers = (CALLS,)

    @staticmethod
    def detect(src: str) -> bool:
        return "tool▁calls▁begin" in src and "<｜Assistant｜>" in src

    def parse(self, text: str, final: bool = False) -> Msg:
        k = text.find(CALLS)
        content = content_until(text, 0, k if k >= 0 else None, [CALLS], final)
        if k < 0:
            return Msg(content)
        s, i, calls = text, k + len(CALLS), []
        while True:
            while i < len(s) and s[i] in _WS:
                i += 1
            if not s.startswith(CALL, i):
                break
            j = s.find(SEP, i)
            nl = s.find("\n", j + len(SEP)) if j >= 0 else -1
            if nl < 0:
                break
            name = s[j + len(SEP):nl].strip()
            b = s.find("```json", nl)
            if b < 0:
                break
            b = b + len("```json")
            while b < len(s) and s[b] in _WS:
                b += 1
            e = json_end(s, b) if b < len(s) else None
            if e is None:
                calls.append(Call(name, s[b:].rstrip(_WS + "`")))
                break
            calls.append(Call(name, s[b:e]))
            c = s.find(END, e)
            if c < 0:
                break
            i = c + len(END)
        return Msg(content, "", calls)
