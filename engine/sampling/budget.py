"""The reasoning budget: llama.cpp's reasoning-budget sampler (common/reasoning-budget.cpp).

A request with a thinking budget carries, ahead of its GBNF in the
channel's grammar area, a header (ipc/budget.py): the budget, the initial
state, and three token sequences -- the thinking start marker, its end
marker, and what is forced when the budget is spent
(``--reasoning-budget-message`` + the end marker). ``make_sampler``
unpacks it and wraps the request's sampler in ``Budget``,
whose states are llama.cpp's:

* IDLE: passthrough, watching for the start sequence (-> COUNTING);
* COUNTING: each generated token spends one; the end sequence ends it
  naturally (-> DONE); at zero -> FORCING, or WAITING_UTF8 while the last
  token left a UTF-8 character unfinished;
* FORCING: the forced sequence, one token per step (every other token at
  -inf: the wrapped sampler still runs for its logits and probabilities,
  its choice is replaced; a chain with a stateful stage, mirostat or
  adaptive_p, is applied to the forced token alone, as llama.cpp's chain
  after its budget sampler sees it) -> DONE;
* DONE: passthrough; a new start sequence re-arms it.

With a lazy grammar (a native tool-call format's), the grammar is held
off while the model thinks (COUNTING, FORCING, WAITING_UTF8: neither
applied nor fed, Chain.hold) and the end marker is replayed into it when
the thinking ends, as llama.cpp's common_sampler (grammar_should_apply):
a trigger written inside the thoughts starts no call. The frontends send a
header with an unlimited budget (UNLIMITED) for that alone.

Budget 0 forces at once. The generation prompt's tokens are accepted first
(the prefill, as llama.cpp's common_sampler_init feeds them): a template
that opened the thinking (``...<think>\\n``) starts the count there --
matched on tokens, as llama.cpp matches, so a marker the prompt's
tokenization merged with its neighbour is not seen there either. The frontends only send a header when the request
has no grammar: a forced token a grammar rejects would abort llama.cpp.
"""
from __future__ import annotations

from typing import Any, Sequence

from ipc.budget import COUNTING, DONE, FORCING, IDLE, WAITING_UTF8


def _utf8_complete(b: bytes) -> bool:
    """The piece does not end inside a UTF-8 character (common_utf8_is_complete)."""
    for k in range(1, min(4, len(b)) + 1):
        c = b[-k]
        if c & 0xC0 != 0x80:  # the lead byte of the last character
            need = 1 if c < 0x80 else 2 if c >> 5 == 6 else 3 if c >> 4 == 14 else 4 if c >> 3 == 30 else 1
            return k >= need
    return len(b) == 0


class Budget:
    """A sampler wrapped by the reasoning budget (the Sampler interface;
    everything else is the wrapped sampler's)."""

    kind = "budget"

    def __init__(self, inner: Any, model: Any, spec: tuple):
        budget, start, end, forced, prefill = spec
        if any(not 0 <= t < model.n_vocab for t in (*start, *end, *forced, *prefill)):
            raise ValueError("reasoning budget token out of vocabulary")
        self.inner, self.model = inner, model
        self.budget, self.start, self.end, self.forced = budget, tuple(start), tuple(end), tuple(forced)
        self.recent: list[int] = []  # the last tokens, for the start/end sequence matches
        self.state, self.left, self.pos = IDLE, budget, 0
        # only a lazy grammar is held off: a plain grammar never gets a budget (module doc)
        self.gate = getattr(inner, "lazy", False)
        for t in prefill:
            self._see(t)
        self._gate()

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def _arm(self) -> None:
        self.state, self.left, self.recent = COUNTING, self.budget, []
        if self.left <= 0:
            self.state, self.pos = FORCING, 0

    def _ends(self, seq: tuple) -> bool:
        return len(self.recent) >= len(seq) and tuple(self.recent[-len(seq):]) == seq

    def sample(self, model: Any, i: int) -> int:
        if self.state == FORCING and self.pos < len(self.forced):
            if getattr(self.inner, "stateful", False):  # mirostat, adaptive_p: they see the forced token only
                return self.inner.force(model, i, self.forced[self.pos])
            self.inner.sample(model, i)
            tok = self.inner.tok = self.forced[self.pos]  # probs() report the forced token
            return tok
        return self.inner.sample(model, i)

    def _gate(self) -> None:
        if self.gate:
            self.inner.hold = self.state not in (IDLE, DONE)

    def accept(self, token: int) -> None:
        held = self.gate and self.inner.hold  # decided before the token, as grammar_should_apply
        self.inner.accept(token)
        self._see(token)
        if held and self.state == DONE:  # the thinking ended: the grammar sees its end marker
            self.inner.feed_grammar(self.end)
        self._gate()

    def _see(self, token: int) -> None:
        """The state machine's step for one token (generated or prefill)."""
        self.recent = (self.recent + [token])[-max(len(self.start), len(self.end)):]
        st = self.state
        if st in (IDLE, DONE):
            if self._ends(self.start):
                self._arm()
        elif st in (COUNTING, WAITING_UTF8):
            if self._ends(self.end):
                self.state = DONE
                return
            ok = True
            vocab = getattr(self.model, "vocab", None)
            if vocab is not None:
                ok = _utf8_complete(vocab.token_to_piece(token, False))
            if st == WAITING_UTF8:
                if ok:
                    self.state, self.pos = FORCING, 0
            else:
                self.left -= 1
                if self.left <= 0:
                    self.state, self.pos = (FORCING, 0) if ok else (WAITING_UTF8, 0)
        elif st == FORCING:
            self.pos += 1
            if self.pos >= len(self.forced):
                self.state = DONE

    def prime(self, tokens: Sequence[int]) -> None:
        self.inner.prime(tokens)

    def probs(self):
        return self.inner.probs()

    def free(self) -> None:
        self.inner.free()
