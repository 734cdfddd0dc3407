"""The generic tool-call answer, parsed as it streams (frontends/text/tools.py
holds the request side).

The model writes ``{"tool_call": {"name", "arguments"}}``,
``{"tool_calls": [...]}`` or ``{"response": ...}`` (a grammar holds it to
that); ``Answer`` turns the growing text into OpenAI's deltas: ``content``
pieces for a response, and per call a first delta with index, id, type and
name, then ``arguments`` pieces (the model's own JSON text of the arguments
object, as it grows).

Why a scanner of its own: a partial-JSON parse from the start on every token
costs O(n) per token, O(n^2) per answer, seconds of worker CPU for a long
response. ``_Scan`` only moves forward: a value's end, once found, is kept;
an unfinished string or container resumes where the last token left it.
Invariant: the buffer only grows (``feed`` appends), so every cached
position stays valid.
"""
from __future__ import annotations

import json
import secrets
import string

_ALNUM = string.ascii_letters + string.digits
_WS = " \t\n\r"


def _hex(h: str) -> int:
    """A \\u escape's code unit; -1 where it is not hex (json.loads then refuses the string)."""
    try:
        return int(h, 16)
    except ValueError:
        return -1


def new_call_id() -> str:
    return "call_" + "".join(secrets.choice(_ALNUM) for _ in range(24))


class _Scan:
    """Forward-only scanning of a growing JSON text ``s``."""

    def __init__(self):
        self.s = ""
        self.ends: dict[int, int] = {}  # value start -> end (complete values)
        self.strs: dict[int, list] = {}  # string start -> [next index, decoded text, end or None]
        self.open: dict[int, list] = {}  # container start -> [next index, depth] (outside any string)

    def ws(self, i: int) -> int:
        s = self.s
        while i < len(s) and s[i] in _WS:
            i += 1
        return i

    def string(self, i: int) -> tuple[str, int | None]:
        """The JSON string at s[i] == '"': (decoded text so far, end or
        None). The text decodes in pieces cut between whole characters and
        escapes (a surrogate pair kept together), so it only ever grows."""
        st = self.strs.get(i)
        if st is None:
            st = self.strs[i] = [i + 1, "", None]
        if st[2] is not None:
            return st[1], st[2]
        s, j = self.s, st[0]
        safe = j
        while j < len(s):
            c = s[j]
            if c == '"':
                st[1] += json.loads('"' + s[st[0]:j] + '"')
                st[0], st[2] = j, j + 1
                return st[1], st[2]
            if c == "\\":
                if j + 1 >= len(s):
                    break
                if s[j + 1] == "u":
                    if j + 6 > len(s):
                        break
                    if 0xD800 <= _hex(s[j + 2:j + 6]) < 0xDC00:  # a high surrogate: its pair, if a \u follows
                        if j + 8 > len(s) or (s[j + 6:j + 8] == "\\u" and j + 12 > len(s)):
                            break  # wait for what follows
                        j += 12 if s[j + 6:j + 8] == "\\u" else 6  # a lone one decodes alone (json.loads)
                    else:
                        j += 6
                else:
                    j += 2
            else:
                j += 1
            safe = j
        if safe > st[0]:
            st[1] += json.loads('"' + s[st[0]:safe] + '"')
            st[0] = safe
        return st[1], None

    def end(self, i: int) -> int | None:
        """End of the JSON value starting at s[i], None while it is cut."""
        e = self.ends.get(i)
        if e is not None:
            return e
        s = self.s
        c = s[i]
        if c == '"':
            e = self.string(i)[1]
        elif c in "{[":
            st = self.open.setdefault(i, [i, 0])
            j, depth = st
            while j < len(s):
                c = s[j]
                if c == '"':
                    e = self.string(j)[1]
                    if e is None:
                        break  # resume at this string's start (its own state is cached)
                    j = e
                    continue
                if c in "{[":
                    depth += 1
                elif c in "}]":
                    depth -= 1
                    if depth == 0:
                        e = j + 1
                        break
                j += 1
            st[0], st[1] = j, depth
            if e is None or depth:
                return None
        else:
            j = i
            while j < len(s) and s[j] not in ",}] \t\n\r":
                j += 1
            if j >= len(s):
                return None  # a number may go on
            e = j
        self.ends[i] = e
        return e

    def members(self, i: int):
        """(key, value start) of the object at s[i] == '{', as far as the text goes."""
        s = self.s
        i = self.ws(i + 1)
        while i < len(s) and s[i] != "}":
            if s[i] == ",":
                i = self.ws(i + 1)
                continue
            if s[i] != '"':
                return
            key, e = self.string(i)
            if e is None:
                return
            i = self.ws(e)
            if i >= len(s) or s[i] != ":":
                return
            i = self.ws(i + 1)
            if i >= len(s):
                return
            yield key, i
            e = self.end(i)
            if e is None:
                return
            i = self.ws(e)

    def call(self, i: int) -> tuple[str | None, str]:
        name, args = None, ""
        s = self.s
        for key, v in self.members(i):
            if key == "name" and s[v] == '"':
                n, e = self.string(v)
                name = n if e is not None else None
            elif key == "arguments":
                e = self.end(v)
                args = s[v:len(s) if e is None else e]
        return name, args

    def view(self) -> tuple[str | None, list[tuple[str | None, str]]] | None:
        """(response text so far, [(name, or None while cut; arguments text
        so far)]); None if the text is not a generic answer."""
        s = self.s
        i = self.ws(0)
        if i >= len(s) or s[i] != "{":
            return None
        content, calls = None, []
        for key, v in self.members(i):
            if key == "response":
                if s[v] == '"':
                    content = self.string(v)[0]
                else:  # a response_format object: its JSON text
                    e = self.end(v)
                    content = s[v:len(s) if e is None else e]
            elif key == "tool_call" and s[v] == "{":
                calls.append(self.call(v))
            elif key == "tool_calls" and s[v] == "[":
                j = self.ws(v + 1)
                while j < len(s) and s[j] == "{":
                    calls.append(self.call(j))
                    e = self.end(j)
                    if e is None:
                        break
                    j = self.ws(e)
                    if j < len(s) and s[j] == ",":
                        j = self.ws(j + 1)
        return content, calls


class Answer:
    """Turns a generic answer, fed as it streams, into OpenAI deltas.

    Invariant: the concatenation of the deltas is the final message, so a
    streamed and a whole answer agree (``message`` feeds the whole text).
    A call's first delta waits until its name is complete.
    """

    def __init__(self):
        self.scan = _Scan()
        self.content = ""  # sent so far
        self.calls: list[dict] = []  # sent so far: {"id", "name", "arguments"}

    def feed(self, text: str) -> list[dict]:
        if not text:
            return []
        self.scan.s += text
        v = self.scan.view()
        if v is None:
            return []
        content, calls = v
        out = []
        if content is not None and len(content) > len(self.content):
            out.append({"content": content[len(self.content):]})
            self.content = content
        for idx, (name, args) in enumerate(calls):
            if name is None:
                break
            if idx == len(self.calls):
                self.calls.append({"id": new_call_id(), "name": name, "arguments": ""})
                out.append({"tool_calls": [{"index": idx, "id": self.calls[idx]["id"], "type": "function",
                                            "function": {"name": name, "arguments": ""}}]})
            sent = self.calls[idx]
            if len(args) > len(sent["arguments"]):
                out.append({"tool_calls": [{"index": idx, "function": {"arguments": args[len(sent["arguments"]):]}}]})
                sent["arguments"] = args
        return out

    def finish(self) -> list[dict]:
        """Deltas left at the end: an answer that never took the generic
        form (cut before its first key) is passed on as plain content."""
        if not self.content and not self.calls and self.scan.s:
            self.content = self.scan.s
            return [{"content": self.scan.s}]
        return []

    def message(self, text: str) -> dict:
        """The whole answer as an OpenAI assistant message."""
        self.feed(text)
        self.finish()
        msg: dict = {"role": "assistant", "content": self.content or None}
        if self.calls:
            msg["tool_calls"] = [{"id": c["id"], "type": "function",
                                  "function": {"name": c["name"], "arguments": c["arguments"]}} for c in self.calls]
        elif msg["content"] is None:
            msg["content"] = ""
        return msg
