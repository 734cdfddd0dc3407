"""Llama 3.1 / 3.2 / 3.3: one call as a bare JSON object
``{"type": "function", "name": ..., "parameters": {...}}`` ("type" optional),
after any content. ``<|python_tag|>`` stays content, as llama-server's
autoparser leaves it (it has no built-in-tools route any more)."""
from __future__ import annotations

import re

from .core import Format, Msg
from .hermes import _WS, json_calls

_START = re.compile(r'\{\s*"(?:type|name)"\s*:')
_OPENING = re.compile(r'\{\s*(?:"(?:t(?:y(?:p(?:e(?:"\s*)?)?)?)?|n(?:a(?:m(?:e(?:"\s*)?)?)?)?)?)?')  # may become _START


class Llama3(Format):
    name = "Llama 3.x"
    triggers = ('{"name"', '{"type"')

    @staticmethod
    def detect(src: str) -> bool:
        return "<|start_header_id|>" in src and "ipython" in src

    def parse(self, text: str, final: bool = False) -> Msg:
        m = _START.search(text)
        if m is None:
            last = text.rfind("{")
            content = text if final or last < 0 or not _OPENING.fullmatch(text, last) else text[:last]
            return Msg("" if not final and not content.strip(_WS) else content)
        content = text[:m.start()]
        calls, tail = json_calls(self, text[m.start():], "", "", "parameters", final)
        if not calls and not final:
            return Msg(content if content.strip(_WS) else "")
        return Msg((content if content.strip(_WS) else "") + tail, "", calls[:1])
