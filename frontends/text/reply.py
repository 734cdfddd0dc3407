"""One choice's answer as OpenAI's chat message and deltas, for every API.

The one path a chat answer's text takes, whatever endpoint asked: the
reasoning split first (frontends/text/reasoning.py: thoughts never reach
what follows), then the content through the tool-call parser when the
request has tools (frontends/text/toolparse.py ``Answer``; a template
family's own parser takes the same place). Out come OpenAI's chat deltas
(``{"reasoning_content"}``, ``{"content"}``, ``{"tool_calls": [...]}``),
which /v1/chat/completions sends as they are and /v1/messages and
/v1/responses turn into their own events (frontends/api/anthropic.py, responses.py).
Invariant: the deltas add up to ``message()`` of the same text.
"""
from __future__ import annotations

from .reasoning import Splitter, Think
from .toolparse import Answer


class Reply:
    """``parser``: the content's tool-call parser (``Answer``'s interface:
    feed, finish, message, calls), None without tools; ``of(plan)`` picks it."""

    def __init__(self, think: Think | None, parser=None):
        self.split = Splitter(think) if think is not None else None
        self.parser = parser
        self.reasoning = ""
        self.content = ""  # the content deltas so far (the parser's, with tools)

    @classmethod
    def of(cls, pl) -> "Reply":
        """The reply of a request's plan (frontends/text/params.py Plan): the
        plan's tool parser (``pl.answer``: a native format's Stream or the
        generic Answer, frontends/text/tools.py answerer). The reasoning
        split serves every template, native tool formats too (<think> in
        Qwen or DeepSeek R1); only a format whose own syntax carries the
        thoughts (gpt-oss's channels) takes its place."""
        parser = pl.answer() if pl.answer is not None else Answer() if pl.tools else None
        fmt = getattr(parser, "fmt", None)
        think = None if getattr(fmt, "splits_thoughts", False) else pl.think
        return cls(think, parser)

    @property
    def calls(self) -> list[dict]:
        """Tool calls sent so far: {"id", "name", "arguments"} (a native
        format's Stream holds them as toolfmt Call records)."""
        if self.parser is None:
            return []
        return [c if isinstance(c, dict) else {"id": c.id, "name": c.name, "arguments": c.arguments}
                for c in self.parser.calls]

    def feed(self, text: str) -> list[dict]:
        if not text:
            return []
        return self._deltas(self.split.feed(text) if self.split is not None else [("content", text)], False)

    def finish(self) -> list[dict]:
        return self._deltas(self.split.finish() if self.split is not None else [], True)

    def _deltas(self, pieces: list[tuple[str, str]], final: bool) -> list[dict]:
        out: list[dict] = []
        for kind, t in pieces:
            if kind == "reasoning":
                out.append({"reasoning_content": t})
            elif self.parser is not None:
                out += self.parser.feed(t)
            else:
                out.append({"content": t})
        if final and self.parser is not None:
            out += self.parser.finish()
        for d in out:
            self.reasoning += d.get("reasoning_content") or ""
            self.content += d.get("content") or ""
        return out

    def message(self, text: str) -> dict:
        """The whole answer as an OpenAI assistant message."""
        self.feed(text)
        self.finish()
        msg = self.parser.message("") if self.parser is not None else {"role": "assistant", "content": self.content}
        if self.reasoning:
            msg["reasoning_content"] = self.reasoning
        return msg


def thought_tokens(new_reply, pieces: list[bytes]) -> int:
    """How many generated tokens the thinking took (Responses'
    ``output_tokens_details.reasoning_tokens``): the tokens before the one
    where the answer (content or a tool call) starts, its end marker and
    the whitespace after it included; all of them when the answer never
    started. ``new_reply()`` is a fresh Reply of the request, ``pieces``
    the tokens' bytes as the answer was decoded. The parse of a prefix is
    monotone in it (what showed stays), so a binary search over the
    prefix length finds that token in a few parses."""

    def answered(k: int) -> bool:
        ds = new_reply().feed(b"".join(pieces[:k]).decode("utf-8", "ignore"))
        return any(d.get("content") or d.get("tool_calls") for d in ds)

    lo, hi = 0, len(pieces)  # answered(lo) is False (nothing fed), the answer starts in (lo, hi] or never
    if not answered(hi):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if answered(mid):
            hi = mid
        else:
            lo = mid
    return hi - 1
