"""Reasoning ("thinking") split out of a chat answer, as llama-server splits it.

llama-server (common/chat.cpp, chat-diff-analyzer.cpp) learns a template's
thinking markers by rendering it: an assistant message with and without
``reasoning_content`` (the text between is framed by the markers), and the
generation prompt with ``enable_thinking`` false and true (a template that
opens the thinking itself, as DeepSeek R1's ``<think>\\n``, shows its start
marker at the end; one whose other text changes too, as SmolLM3's system
message, is matched on its prompt's tail). Its source patches and
specialized templates name the rest: old Qwen / DeepSeek templates that
only strip ``</think>`` from history, Granite 3.3 (``<think>``/``</think>``),
Ministral 3 (``[THINK]``/``[/THINK]``), Kimi K2, LFM2. A template without
markers (ChatML, SmolLM2's own) has no reasoning: a ``<think>`` the model
writes stays in ``content``, as there.

The parser then reads ``prefix + output``, where ``prefix`` is the part of
the request's generation prompt from the start marker on (so a template
that opened ``<think>`` has the model's first words in the reasoning): an
optional ``start ... end`` block at the beginning (after whitespace) is the
reasoning (``cut``: thoughts of whitespace alone are none, the template's
whitespace after the end marker is skipped; with no block, the answer's
leading whitespace), the rest is content; a block never closed (the
answer was cut) is all reasoning. Native tool formats get the same split
first (reply.py). Measured on llama-server with SmolLM2 under the DeepSeek R1
template: output ``I think.</think>\\n\\nHello`` -> reasoning ``\\nI
think.``, content ``\\n\\nHello``; under Qwen 3's ``<think>\\nA\\n</think>\\n\\nB``
-> ``A\\n`` and ``B``.

``--reasoning-format`` / a request's ``reasoning_format``: ``none`` leaves
everything (prefix included) in ``content``; ``auto``, ``deepseek`` and
``deepseek-legacy`` fill ``reasoning_content`` (legacy behaves as deepseek,
streamed or not, as the vendored llama-server does: the
``reasoning_in_content`` it sets for a streamed legacy request is read by
no parser, and shows only in generation_settings).
Stop strings and n_predict count the whole output, thoughts included, as
llama-server's do (gen.py sees the raw text; this module only splits it).

``Splitter`` is the streaming form: it never shows part of a marker, and
the concatenation of its pieces equals ``split`` of the whole text.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass

from .errors import ApiError, bad
from .toolfmt.qwen3coder import Qwen3Coder

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
    the start / after the end marker, so the parser skips it there
    (``end_trail``: exactly that whitespace, which is what llama-server's
    autoparser skips after the end marker; empty: any whitespace)."""

    start: str
    end: str
    start_ws: bool = False
    end_ws: bool = False
    end_lead: str = ""  # whitespace the template writes before the end marker (the budget forces it too)
    end_trail: str = ""
    opens: str = ""  # also ends the thoughts, and starts the answer (Qwen 3.5's <tool_call>)


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
                            after[:len(after) - len(after.lstrip(_WS))], rest[:len(rest) - len(rest.lstrip(_WS))])
    if found is None:
        found = _toggled(tmpl)
    if found is None:
        found = _patched(src)
    if found is not None and found.end == "</think>" and "<think>" in src and Qwen3Coder.detect(src):
        # qwen3-coder.cpp's thinking_end_tags: a call may end the thoughts without </think>
        found = dataclasses.replace(found, opens="<tool_call>")
    if found is not None and not found.start:
        # the start marker from the generation prompt: with thinking on it ends with it
        gen = _safe(tmpl, [_USER], True, on) or ""
        tail = [m for m in MARKER.finditer(gen) if not gen[m.end():].strip(_WS)]
        if not tail:
            return None
        found = dataclasses.replace(found, start=tail[-1].group(), start_ws=gen[tail[-1].end():] != "")
    return found


def _toggled(tmpl) -> Markers | None:
    """compare_thinking_enabled: the generation prompt with thinking off
    against on. Off closes the thinking the prompt opened (DeepSeek V3.1's
    ``<think>`` then ``</think>``) or adds both markers (Command R7B); where
    the rest of the prompt changes too (SmolLM3's system message), the
    last 64 characters of one are found in the other and what follows
    them is the pair."""
    g_on = _safe(tmpl, [_USER], True, {"enable_thinking": True})
    g_off = _safe(tmpl, [_USER], True, {"enable_thinking": False})
    if g_on is None or g_off is None or g_on == g_off:
        return None
    p = 0
    while p < min(len(g_on), len(g_off)) and g_on[p] == g_off[p]:
        p += 1
    s = 0
    while s < min(len(g_on), len(g_off)) - p and g_on[-1 - s] == g_off[-1 - s]:
        s += 1
    left, right = g_off[p:len(g_off) - s].strip(_WS), g_on[p:len(g_on) - s].strip(_WS)
    if left and not right and g_off.rstrip(_WS).endswith(left):
        ms = MARKER.findall(left)
        if len(ms) == 2 and left == ms[0] + ms[1]:
            return Markers(ms[0], ms[1])
        before = [m.group() for m in MARKER.finditer(g_off[:len(g_off.rstrip(_WS)) - len(left)])]
        if ms == [left] and before and g_off[:len(g_off.rstrip(_WS)) - len(left)].rstrip(_WS).endswith(before[-1]):
            return Markers(before[-1], left)
        return None
    if left and right:
        for base, ext in ((g_on, g_off), (g_off, g_on)):
            anchor = base[-64:]
            k = ext.rfind(anchor)
            if k < 0 or k + len(anchor) >= len(ext):
                continue
            extra = ext[k + len(anchor):].strip(_WS)
            ms = MARKER.findall(extra)
            if len(ms) == 2 and not extra.replace(ms[0], "", 1).replace(ms[1], "", 1).strip(_WS):
                return Markers(ms[0], ms[1])
    return None


def _patched(src: str) -> Markers | None:
    """chat-diff-analyzer.cpp's source patches and chat.cpp's specialized
    templates that name markers the probes cannot see."""
    if "content.split('</think>')" in src and "reasoning_content" not in src:
        return Markers("<think>", "</think>")  # old Qwen / DeepSeek templates
    if "Write your thoughts between <think></think> and write your response between <response></response>" in src:
        return Markers("<think>", "</think>")  # Granite 3.3
    if all(w in src for w in ("[SYSTEM_PROMPT]", "[TOOL_CALLS]", "[ARGS]")) and "[CALL_ID]" not in src:
        return Markers("[THINK]", "[/THINK]")  # Ministral / Magistral 3 (common/parsers/ministral3.cpp)
    if "<|tool_calls_section_begin|>" in src and "<|tool_call_begin|>" in src:
        return Markers("<think>", "</think>")  # Kimi K2 (common/parsers/kimi-k2.cpp)
    lfm2 = ("<|tool_list_start|>" in src and "<|tool_list_end|>" in src) or \
        ("List of tools: [" in src and "<|tool_list_start|>" not in src)
    if lfm2 and "<think>" in src:
        return Markers("<think>", "</think>")  # LFM2 / LFM2.5 (common/parsers/lfm2.cpp; their thoughts are "thinking")
    return None


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


_LEAD = re.compile(r"[ \t\r\n]*")
_TEXT = re.compile(r"[^ \t\r\n]")


def cut(mk: Markers, text: str, final: bool, scan: int = 0) -> tuple[int, int, int | None]:
    """Where the thoughts and the answer lie in ``text`` (the generation
    prompt's opened part, then the output), as llama-server's parser reads
    them: ``(rs, re, answer)``, the reasoning ``text[rs:re]`` (rs == re:
    none) and the answer from ``answer`` on (None: not known yet, the text
    may still go either way). Whitespace before the start marker is
    skipped, and so is the answer's leading whitespace when there are no
    thoughts; thoughts of whitespace alone are none (llama-server drops
    them); after the end marker the template's own whitespace is skipped.
    While partial, what may still become a marker is held back, so every
    value only grows with the text. ``scan``: no end marker starts before
    it (a caller's hint, to keep a long thought's parse linear)."""
    i = _LEAD.match(text).end()
    if not text.startswith(mk.start, i):
        if not final and mk.start.startswith(text[i:]):
            return 0, 0, None  # nothing yet, or the start of the start marker
        return 0, 0, i
    j = i + len(mk.start)
    if mk.start_ws:
        j = _LEAD.match(text, j).end()
    k = text.find(mk.end, max(j, scan))
    if mk.opens:
        o = text.find(mk.opens, max(j, scan))
        if o >= 0 and (k < 0 or o < k):  # the answer starts at it
            return j, (o if _TEXT.search(text, j, o) else j), o
    if k < 0:
        e = len(text) if final else len(text) - max(_partial(text, mk.end), _partial(text, mk.opens))
        e = max(e, j)
        return j, (e if _TEXT.search(text, j, e) else j), (len(text) if final else None)
    rs, re_ = j, (k if _TEXT.search(text, j, k) else j)
    a = k + len(mk.end)
    if mk.end_trail:
        n = 0
        while n < len(mk.end_trail) and a + n < len(text) and text[a + n] == mk.end_trail[n]:
            n += 1
        if not final and a + n == len(text) and n < len(mk.end_trail):
            return rs, re_, None  # the template's whitespace may go on
        a += n
    elif mk.end_ws:
        n = _LEAD.match(text, a).end()
        if not final and n == len(text):
            return rs, re_, None
        a = n
    return rs, re_, a


class Splitter:
    """Streaming split: ``feed(text)`` -> [(kind, text)], kind "reasoning"
    or "content"; ``finish()`` flushes what was held. Each piece is what
    ``cut`` of the text so far adds to the one before (cut only grows), so
    the pieces add up to ``split`` of the whole text and never show part
    of a marker; once the answer has started, the text goes straight on."""

    def __init__(self, think: Think):
        self.t = think
        self.mk = think.markers
        self.text = think.prefix if think.active else ""  # what the parser reads first
        self.answer: int | None = None if think.active else 0
        self.r_end: int | None = None  # the reasoning sent ends at text[r_end]
        self.sent = 0  # content sent: text[answer:sent]
        self.scan = 0  # no end marker starts before it
        self.reasoning = self.content = ""
        self.pending = "" if think.active else think.prefix  # reasoning_format none: the prefix is content

    def feed(self, text: str) -> list[tuple[str, str]]:
        if self.pending:
            text, self.pending = self.pending + text, ""
        if not text:
            return []
        if self.answer is not None and self.sent == len(self.text):
            self.text += text
            self.sent = len(self.text)
            return self._out("content", text)
        self.text += text
        return self._run(False)

    def finish(self) -> list[tuple[str, str]]:
        out = self.feed("") if self.pending else []
        return out + (self._run(True) if self.answer is None or self.sent < len(self.text) else [])

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
        if self.answer is None:
            rs, re_, a = cut(self.mk, self.text, final, self.scan)
            if re_ > rs:
                out += self._out("reasoning", self.text[rs if self.r_end is None else self.r_end:re_])
                self.r_end = re_
            if a is None:
                if self.text.find(self.mk.end, self.scan) < 0:  # (an `opens` found would have started the answer)
                    self.scan = max(self.scan, len(self.text) - max(len(self.mk.end), len(self.mk.opens)) + 1)
                return out
            self.answer = self.sent = a
        out += self._out("content", self.text[self.sent:])
        self.sent = len(self.text)
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
