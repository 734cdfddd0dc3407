"""gpt-oss (OpenAI harmony): the answer is messages on channels, each
``<|channel|>NAME[ to=functions.F][ <|constrain|>json]<|message|>BODY``
ended by ``<|end|>`` (then ``<|start|>assistant`` opens the next) or by
``<|call|>`` / ``<|return|>`` (stop tokens). ``analysis`` is the reasoning,
``final`` and a plain ``commentary`` (a preamble) the content, a message to
``functions.F`` a call whose body is its JSON arguments. The recipient may
also stand in the role header (``<|start|>assistant to=functions.F``).
With the request's tools known, the recipient is the longest tool name it
starts with (llama-server's parser reads the name as one of the tools'
names; what follows it, as ``_of_day`` in ``to=functions.get_time_of_day``,
passes for the constraint its grammar allows there)."""
from __future__ import annotations

import re

from .core import Call, Format, Msg, held

CH, MSG, START = "<|channel|>", "<|message|>", "<|start|>assistant"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
_TO = re.compile(r"\bto=functions\.([^\s<]+)")


class GptOss(Format):
    name = "GPT-OSS"
    triggers = (" to=functions.", "<|channel|>commentary to=")
    splits_thoughts = True  # the analysis channel

    def __init__(self, source: str = ""):
        super().__init__(source)
        self.names: list[str] = []

    def set_tools(self, tools: list[dict]) -> None:
        self.names = sorted((t.get("function", {}).get("name") or "" for t in tools), key=len, reverse=True)

    def _name(self, to: str) -> str:
        return next((n for n in self.names if n and to.startswith(n)), to)

    @staticmethod
    def detect(src: str) -> bool:
        return CH in src

    def parse(self, text: str, final: bool = False) -> Msg:
        m = Msg()
        i = 0
        while i < len(text):
            h = text.find(MSG, i)
            if h < 0:
                rest = text[i:]
                if i == 0 and CH not in rest and not (CH.startswith(rest) or START.startswith(rest)):
                    # no harmony at all: plain text (llama-server refuses it)
                    m.content += rest if final else rest[:len(rest) - held(rest, (CH, START))]
                break
            header = text[i:h]
            b = h + len(MSG)
            e, n = len(text), 0
            for end in ENDS:
                k = text.find(end, b)
                if 0 <= k < e:
                    e, n = k, len(end)
            body = text[b:e]
            done = n > 0
            if not done and not final:
                body = body[:len(body) - held(body, ENDS)]
            to = _TO.search(header)
            chan = header.split(CH, 1)[1] if CH in header else ""
            chan = re.split(r"[\s<]", chan.strip(), 1)[0] if chan.strip() else ""
            if to:
                # trailing whitespace held back while partial (it may turn out inside the JSON): monotone
                m.calls.append(Call(self._name(to.group(1)), body.strip()))
            elif chan == "analysis":
                m.reasoning += body
            elif chan in ("final", "commentary"):
                m.content += body
            if not done:
                break
            i = e + n
            if text.startswith(START, i):
                i += len(START)
        return m
