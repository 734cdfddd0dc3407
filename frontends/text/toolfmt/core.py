"""What every native tool-call format shares: the parsed message, the
``Format`` interface its module implements, and ``Stream``, which turns a
format's parses of the growing text into OpenAI deltas.

The one invariant a format's ``parse(text, final=False)`` keeps: it is
monotone in ``text`` -- for a longer text, the content, the reasoning, the
number of calls and each call's name and arguments only grow (each old value
is a prefix of the new one), and ``parse(text, final=True)`` only adds to
``parse(text)``. A format holds back what it cannot yet tell apart (a
trailing ``<tool`` may become a tag; a call's first delta waits for its
name). ``Stream`` relies on it: a delta is the new value minus the old, so
the deltas streamed at any cut points add up to the non-streamed message
(tests/test_toolfmt.py checks every cut point of every golden case).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from frontends.text.toolparse import new_call_id


@dataclass
class Call:
    name: str
    arguments: str  # JSON text, as llama-server returns it
    id: str = ""  # a model-written id (Mistral); empty: the server makes one


@dataclass
class Msg:
    content: str = ""
    reasoning: str = ""
    calls: list[Call] = field(default_factory=list)


def held(text: str, markers) -> int:
    """How many trailing characters of ``text`` could be the start of one of
    ``markers`` (to be held back from content until the next piece)."""
    best = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:k]):
                best = k
                break
    return best


def json_end(s: str, i: int) -> int | None:
    """End of the complete JSON value at s[i] (after whitespace), None while cut."""
    try:
        _, e = _DEC.raw_decode(s, i)
    except ValueError:
        return None
    return e


_DEC = json.JSONDecoder()


class Format:
    """One tool-call syntax. Subclasses set ``name`` (llama-server's family
    name, shown as the plan's chat_format), ``triggers`` (the words that open
    a call: a lazy grammar starts there) and implement ``parse``."""

    name = "Generic"
    triggers: tuple[str, ...] = ()
    native = True  # False: the generic JSON form (frontends/text/tools.py's note and grammar)
    # True: the format's own syntax carries the thoughts (gpt-oss's analysis channel); otherwise the
    # reasoning split (frontends/text/reasoning.py) takes them off first and ``parse`` sees the answer only
    splits_thoughts = False

    def __init__(self, source: str = ""):
        self.source = source

    def parse(self, text: str, final: bool = False) -> Msg:
        raise NotImplementedError

    def stream(self) -> "Stream":
        return Stream(self)


class Stream:
    """OpenAI deltas from a format's parses of the growing text (the
    interface of frontends/text/toolparse.py's Answer: feed, finish, message)."""

    def __init__(self, fmt: Format):
        self.fmt = fmt
        self.text = ""
        self.sent = Msg()
        self.ids: list[str] = []
        self.calls = self.sent.calls  # the Answer interface: truthy once a call was sent

    def _diff(self, m: Msg) -> list[dict]:
        out, s = [], self.sent
        if len(m.reasoning) > len(s.reasoning):
            out.append({"reasoning_content": m.reasoning[len(s.reasoning):]})
            s.reasoning = m.reasoning
        if len(m.content) > len(s.content):
            out.append({"content": m.content[len(s.content):]})
            s.content = m.content
        for i, c in enumerate(m.calls):
            if i == len(s.calls):
                self.ids.append(c.id or new_call_id())
                s.calls.append(Call(c.name, "", self.ids[i]))
                out.append({"tool_calls": [{"index": i, "id": self.ids[i], "type": "function",
                                            "function": {"name": c.name, "arguments": ""}}]})
            sent = s.calls[i]
            if len(c.arguments) > len(sent.arguments):
                out.append({"tool_calls": [{"index": i, "function": {"arguments": c.arguments[len(sent.arguments):]}}]})
                sent.arguments = c.arguments
        return out

    def feed(self, text: str) -> list[dict]:
        if not text:
            return []
        self.text += text
        return self._diff(self.fmt.parse(self.text))

    def finish(self) -> list[dict]:
        return self._diff(self.fmt.parse(self.text, final=True))

    def message(self, text: str) -> dict:
        """The whole answer as an OpenAI assistant message."""
        self.feed(text)
        self.finish()
        s = self.sent
        msg: dict = {"role": "assistant", "content": s.content}
        if s.reasoning:
            msg["reasoning_content"] = s.reasoning
        if s.calls:
            msg["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}} for c in s.calls]
        return msg


def content_until(text: str, i: int, k: int | None, markers, final: bool) -> str:
    """Content text[i:k] (k None: to the end, holding back a possible marker start)."""
    if k is not None:
        return text[i:k]
    body = text[i:]
    return body if final else body[:len(body) - held(body, markers)]
