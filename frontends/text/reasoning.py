"""Reasoning ("thinking") split out of a chat answer, as llama-server splits it.

llama-server (common/chat.cpp, chat-diff-analyzer.cpp) learns a template's
thinking markers by rendering it: an assistant message with and without
``reasoning_content`` (the text between is framed by the markers), and the
generation prompt with ``enable_thinking`` false and true (a template that
opens the thinking itself, as DeepSeek R1's ``<think>\\n``, shows its start
marker at the end). Old Qwen / DeepSeek templates that only strip
``</think>`` from history get ``<think>``/``</think>``. A template without
markers (ChatML, SmolLM2's own) has no reasoning: a ``<think>`` the model
writes stays in ``content``, as there.

The parser then reads ``prefix + output``, where ``prefix`` is the part of
the request's generation prompt from the start marker on (so a template
that opened ``<think>`` has the model's first words in the reasoning): an
optional ``start ... end`` block at the very beginning is the reasoning
(whitespace the template put around a marker is optional around it), the
rest is content; a block never closed (the answer was cut) is all
reasoning. Measured on llama-server with SmolLM2 under the DeepSeek R1
template: output ``I think.</think>\\n\\nHello`` -> reasoning ``\\nI
think.``, content ``\\n\\nHello``; under Qwen 3's ``<think>\\nA\\n</think>\\n\\nB``
-> ``A\\n`` and ``B``.

``--reasoning-format`` / a request's ``reasoning_format``: ``none`` leaves
everything (prefix included) in ``content``; ``auto``, ``deepseek`` and
``deepseek-legacy`` fill ``reasoning_content`` (legacy behaves as deepseek,
as the vendored llama-server does for a non-streamed answer).
Stop strings and n_predict count the whole output, thoughts included, as
llama-server's do (gen.py sees the raw text; this module only splits it).

``Splitter`` is the streaming form: it never shows part of a marker, and
the concatenation of its pieces equals ``split`` of the whole text.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from .errors import ApiError, bad

FORMATS = ("auto", "deepseek", "deepseek-legacy", "none")
MARKER = re.compile(r"<[^<>\s][^<>\n]{0,40}>|\[[^\[\]\s][^\[\]\n]{0,40}\]|◁[^◁▷\n]{1,20}▷")
_USER = {"role": "user", "content": "U_USER_MSG Hello END_U"}
_THOUGHT = "REASON_PART I am thinking END_R"
_ANSWER = "A_ASST_MSG I can help END_A"
_WS = " \t\r\n"


@dataclass(frozen=True)
class Markers:
    """A template's thinking markers: ``start``/``end`` without their
    whitespace; ``start_ws`` / ``end_ws``: the template put whitespace after
    the start / after the end marker, so the parser skips it there."""

    start: str
    end: str
    start_ws: bool = False
    end_ws: bool = False
    end_lead: str = ""  # whitespace the template writes before the end marker (the budget forces it too)


def _safe(tmpl, msgs: list[dict], agp: bool, extra: dict) -> str | None:
    try:
        return tmpl.render(msgs, agp, extra)
    except (ApiError, Exception):  # noqa: BLE001 -- a probe that fails shows nothing
        return None


@functools.lru_cache(maxsize=8)
def markers(tmpl) -> Markers | None:
    """The template's markers (None: it has no reasoning), probed once."""
    src = getattr(tmpl, "source", "") or ""
    on = {"enable_thinking": True}
    with_r = _safe(tmpl, [_USER, {"role": "assistant", "content": _ANSWER, "reasoning_content": _THOUGHT}], False, on)
    found = None
    if with_r and _THOUGHT in with_r:
        k = with_r.index(_THOUGHT)
        before, after = with_r[:k], with_r[k + len(_THOUGHT):]
        pre = [m for m in MARKER.finditer(before) if not before[m.end():].strip(_WS)]
        post = MARKER.match(after.lstrip(_WS))
        if post is not None:
            rest = after.lstrip(_WS)[post.end():]
            found = Markers(pre[-1].group() if pre else "", post.group(),
                            bool(pre) and before[pre[-1].end():] != "", rest[:1] in tuple(_WS) and rest != "",
                            after[:len(after) - len(after.lstrip(_WS))])
    if found is None:  # a template that closes the thinking itself when it is off (Command R7B)
        g_on, g_off = _safe(tmpl, [_USER], True, on), _safe(tmpl, [_USER], True, {"enable_thinking": False})
        if g_on is not None and g_off is not None and g_off.startswith(g_on):
            extra = g_off[len(g_on):].strip(_WS)
            ms = MARKER.findall(extra)
            if len(ms) == 2 and extra.startswith(ms[0]) and extra.endswith(ms[1]):
                found = Markers(ms[0], ms[1])
    if found is None and "content.split('</think>')" in src and "reasoning_content" not in src:
        found = Markers("<think>", "</think>")  # old Qwen / DeepSeek templates (chat-diff-analyzer.cpp)
    if found is not None and not found.start:
        # the start marker from the generation prompt: with thinking on it ends with it
        gen = _safe(tmpl, [_USER], True, on) or ""
        tail = [m for m in MARKER.finditer(gen) if not gen[m.end():].strip(_WS)]
        if not tail:
            return None
        found = Markers(tail[-1].group(), found.end, gen[tail[-1].end():] != "", found.end_ws, found.end_lead)
    return found


@dataclass
class Think:
    """One request's reasoning settings."""

    markers: Markers | None
    fmt: str  # one of FORMATS
    prefix: str = ""  # the generation prompt from the start marker on (what the parser reads first)
    gen: str = ""  # the whole generation prompt (the reasoning budget's prefill)

    @property
    def active(self) -> bool:
        return self.markers is not None and self.fmt != "none"


def get_format(body: dict, default: str) -> str:
    v = body.get("reasoning_format")
    if v is None:
        return default
    if v not in FORMATS:
        raise bad(f"Field 'reasoning_format': must be one of {', '.join(FORMATS)}, got {v!r}")
    return v


def enable_thinking(kwargs: dict) -> bool | None:
    """chat_template_kwargs' enable_thinking (a string is llama-server's 400)."""
    v = kwargs.get("enable_thinking")
    if v is None or isinstance(v, bool):
        return v
    raise bad('invalid type for "enable_thinking" (expected boolean, got string)')


def generation_prompt(closed: str, opened: str) -> str:
    """What add_generation_prompt adds (common_chat_template_generation_prompt)."""
    k = 0
    while k < min(len(closed), len(opened)) and closed[k] == opened[k]:
        k += 1
    return opened[k:]


def plan(tmpl, fmt: str, gen: str) -> Think:
    """The request's Think from its format and generation prompt ``gen``."""
    mk = markers(tmpl)
    prefix = ""
    if mk is not None and mk.start and mk.start in gen:
        prefix = gen[gen.rfind(mk.start):]
    return Think(mk, fmt, prefix, gen)


class Splitter:
    """Streaming split: ``feed(text)`` -> [(kind, text)], kind "reasoning"
    or "content"; ``finish()`` flushes what was held. Held back: a tail that
    may still become the start marker (at the beginning), the end marker,
    or whitespace the parser may skip after a marker."""

    def __init__(self, think: Think):
        self.t = think
        self.mk = think.markers
        self.buf = ""
        self.state = "start" if think.active else "content"  # start | reasoning | gap | content
        self.reasoning = self.content = ""
        self.pending = think.prefix  # fed before the first output

    def feed(self, text: str) -> list[tuple[str, str]]:
        if self.pending:
            text, self.pending = self.pending + text, ""
        if not text:
            return []
        if self.state == "content":
            return self._out("content", text)
        self.buf += text
        return self._run(False)

    def finish(self) -> list[tuple[str, str]]:
        out = self.feed("") if self.pending else []
        return out + self._run(True)

    def _out(self, kind: str, text: str) -> list[tuple[str, str]]:
        if not text:
            return []
        if kind == "content":
            self.content += text
        else:
            self.reasoning += text
        return [(kind, text)]

    def _run(self, final: bool) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        mk = self.mk
        while self.buf or final:
            b = self.buf
            if self.state == "start":
                if b.startswith(mk.start):
                    rest = b[len(mk.start):]
                    if mk.start_ws:
                        if not rest.strip(_WS) and not final:
                            return out  # the whitespace the parser skips may go on
                        rest = rest.lstrip(_WS)
                    self.state, self.buf = "reasoning", rest
                    continue
                if mk.start.startswith(b) and not final:
                    return out
                self.state, self.buf = "content", ""
                return out + self._out("content", b)
            if self.state == "reasoning":
                k = b.find(mk.end)
                if k >= 0:
                    out += self._out("reasoning", b[:k])
                    self.state, self.buf = "gap", b[k + len(mk.end):]
                    continue
                hold = 0 if final else _partial(b, mk.end)
                out += self._out("reasoning", b[:len(b) - hold])
                self.buf = b[len(b) - hold:]
                return out
            if self.state == "gap":
                if mk.end_ws:
                    if not b.strip(_WS) and not final:
                        return out
                    b = b.lstrip(_WS)
                self.state, self.buf = "content", ""
                return out + self._out("content", b)
            self.buf = ""
            return out + self._out("content", b)
        return out


def _partial(s: str, marker: str) -> int:
    """Length of the longest tail of ``s`` that is a proper prefix of ``marker``."""
    for n in range(min(len(s), len(marker) - 1), 0, -1):
        if marker.startswith(s[-n:]):
            return n
    return 0


def split(think: Think, text: str) -> tuple[str, str]:
    """(reasoning, content) of a whole answer."""
    sp = Splitter(think)
    sp.feed(text)
    sp.finish()
    return sp.reasoning, sp.content
