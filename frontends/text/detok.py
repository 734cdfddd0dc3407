"""Incremental detokenizing that never splits a UTF-8 character, and stop strings.

Token pieces are raw bytes; a character may span several tokens. An
incremental UTF-8 decoder keeps an incomplete tail until the next piece
completes it (invalid bytes become U+FFFD, as a final flush does with an
unfinished tail).

Stop strings (llama-server's ``find_stopping_strings``): a full match ends the
generation; the text from the match on is dropped. Text that ends with a
proper prefix of a stop string is held back until the next piece decides it,
so a client never sees the start of a stop string. Invariant: a stop string
can only begin inside ``pending`` (a released suffix that started one would
have been held), so only ``pending`` is searched.
"""
from __future__ import annotations

import codecs


class Detok:
    """Bytes in, releasable text out, for one generation."""

    __slots__ = ("_dec", "stops", "pending", "parts", "word")

    def __init__(self, stops: list[str] | tuple[str, ...] = ()):
        self._dec = codecs.getincrementaldecoder("utf-8")("replace")
        self.stops = [s for s in stops if s]
        self.pending = ""  # decoded but not released: a possible stop-string start
        self.parts: list[str] = []  # everything released, in order
        self.word: str | None = None  # the stop string that matched

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def feed(self, piece: bytes) -> str:
        """Add one token's bytes; returns the text that may be sent now
        ("" while a character is incomplete or a stop string may be starting)."""
        if self.word is not None:
            return ""
        self.pending += self._dec.decode(piece)
        return self._release(final=False)

    def finish(self) -> str:
        """End of generation: flush what was held (an incomplete character
        becomes U+FFFD; a partial stop match is just text)."""
        if self.word is not None:
            return ""
        self.pending += self._dec.decode(b"", final=True)
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        p = self.pending
        if self.stops and p:
            at, word = -1, None
            for s in self.stops:  # the earliest full match wins
                i = p.find(s)
                if i >= 0 and (at < 0 or i < at):
                    at, word = i, s
            if word is not None:
                self.word = word
                self.pending = ""
                return self._out(p[:at])
            if not final:
                hold = self._partial(p)
                if hold:
                    self.pending = p[-hold:]
                    return self._out(p[:-hold])
        self.pending = ""
        return self._out(p)

    def _partial(self, p: str) -> int:
        """Length of the longest suffix of p that is a proper prefix of a stop string."""
        best = 0
        for s in self.stops:
            first = s[0]
            for k in range(min(len(s) - 1, len(p)), best, -1):
                if p[-k] == first and p.endswith(s[:k]):
                    best = k
                    break
        return best

    def _out(self, s: str) -> str:
        if s:
            self.parts.append(s)
        return s
