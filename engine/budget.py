"""The per-step token budget and prompt admission (issues 15, 24).

Why a budget: one engine step is one llama_decode holding every generating
slot's next token plus prompt chunks, and every streaming user waits for the
whole step before their next token. Uncapped (up to n_batch = 2048 tokens),
a long prompt arriving freezes every stream for seconds on a 2-core CPU.
With a budget, generating slots' tokens go in first and prompts fill only
the room left, in chunks spread over several steps.

How big (``--step-tokens``): a fixed N, or 0 = adaptive (the default): aim
a step with prompts at ``step_mult`` times a pure decode step. Both times come from
the step's measured llama_decode time (the tracer's decode phase): ``d_gen``
is a moving average of steps without prompt tokens, ``per_tok`` of the extra
seconds each prompt token adds to a step. The prompt room is then
``(step_mult - 1) * d_gen / per_tok`` tokens, so a step with prompts costs a
streamer at most ``step_mult`` inter-token gaps (more streams: longer pure
step, more room), but never below ``MIN_ROOM`` tokens while a prompt longer
than that room waits: smaller chunks slow a long prompt's evaluation more
than they shorten the gaps. On the 2-core CPU this project measures on,
the floor is what applies to long prompts below ~80 streams.
docs/ARCHITECTURE.md has the measurements behind the defaults.

Admission (``--admit``): which prompting slots the room goes to. ``fair``
shares it (water-filling: several long prompts advance together and all
finish late); ``fifo`` gives it to the oldest prompt first; ``srf`` to the
one with the fewest tokens left, ageing each by AGE_TOKENS_S per second it
has waited, so no prompt waits forever behind a stream of shorter ones.
docs/ARCHITECTURE.md has the figures behind the default.

Invariants: at least ``QUANTUM`` prompt tokens per step while a prompt waits
(progress), never more than n_batch tokens in all (libllama aborts past it),
and only a prompt's uncached tokens (``remaining``) are ever asked for.
"""
from __future__ import annotations

from typing import Protocol, Sequence

QUANTUM = 32  # smallest prompt chunk worth a slot's turn (plan's share floor)
# Floor of the adaptive room, also used before anything was measured: one
# ubatch (-ub 512). Below it prompt evaluation gets slower per token where
# the KV is deep: 8 streams with 1k/4k prompts got ~27-32-token chunks at
# ~4 ms a token and long prompts waited 3.7x llama-server's time; 256-token
# chunks still 1.30x, 512 (one ubatch, as llama-server evaluates) 1.19x
# (bench_mixed, docs/ARCHITECTURE.md).
MIN_ROOM = 512
ALPHA = 0.2  # weight of a new measurement in the moving averages
MIN_SAMPLE = 16  # a step with fewer prompt tokens says too little about per_tok
RULES = ("fair", "fifo", "srf")  # --admit
# srf ageing: a second of waiting counts as this many tokens fewer left (about one second of
# prompt evaluation on the 2-core CPU), so a long prompt overtakes shorter newcomers once it has
# waited about as long as its own evaluation takes
AGE_TOKENS_S = 512.0


class Prompting(Protocol):
    """What `plan` needs of a slot (engine.slots.Slot has these)."""

    id: int
    t_start: float
    n_cache: int  # prompt tokens reused from the cache

    @property
    def remaining(self) -> int: ...


class StepBudget:
    """Tokens one step may carry, from ``--step-tokens`` and measured times.

    ``step_tokens`` > 0: fixed total per step; 0: adaptive; < 0: off
    (n_batch, the behaviour before issue 15).
    """

    __slots__ = ("step_tokens", "n_batch", "mult", "d_gen", "per_tok")

    def __init__(self, step_tokens: int, n_batch: int, mult: float) -> None:
        self.step_tokens, self.n_batch, self.mult = step_tokens, n_batch, mult
        self.d_gen = 0.0  # seconds of a step without prompt tokens (moving average)
        self.per_tok = 0.0  # seconds a prompt token adds to a step (moving average)

    def room(self, n_gen: int, longest: int = 0) -> int:
        """Prompt tokens this step may add after ``n_gen`` generating tokens
        (already in the batch); ``longest``: the largest uncached remainder
        among the prompting slots. The MIN_ROOM floor applies only when that
        prompt does not fit the time-based room: short prompts (a wave of
        closed-loop requests) are then spread over steps of ~step_mult decode
        steps, the first of them starting to stream sooner. With nothing
        generating (adaptive), the whole batch: no stream waits on this step,
        and a document's first question is evaluated in chunks as big as
        llama-server's (issue 24)."""
        cap = self.n_batch - n_gen
        if self.step_tokens < 0 or (self.step_tokens == 0 and n_gen == 0):
            return cap  # off, or adaptive with no stream to wait on this step: prompts at full speed
        if self.step_tokens > 0:
            want = max(self.step_tokens - n_gen, QUANTUM)  # progress even when streams fill the budget
        elif self.d_gen <= 0.0 or self.per_tok <= 0.0:
            want = MIN_ROOM
        else:
            want = max(int((self.mult - 1.0) * self.d_gen / self.per_tok), QUANTUM)
            if longest > want:  # a long prompt: keep its chunks big enough to evaluate at speed
                want = max(want, MIN_ROOM)
        return max(min(want, cap), 0)

    def observe(self, n_gen: int, n_prompt: int, seconds: float) -> None:
        """Feed one step's llama_decode time."""
        if n_prompt == 0:
            if n_gen:
                self.d_gen = seconds if self.d_gen <= 0.0 else self.d_gen + ALPHA * (seconds - self.d_gen)
            return
        if n_prompt < MIN_SAMPLE or (n_gen and self.d_gen <= 0.0):
            return
        x = max(seconds - (self.d_gen if n_gen else 0.0), 0.0) / n_prompt
        if x > 0.0:
            self.per_tok = x if self.per_tok <= 0.0 else self.per_tok + ALPHA * (x - self.per_tok)


def plan(slots: Sequence[Prompting], room: int, quantum: int = QUANTUM, rule: str = "fair",
         now: float = 0.0) -> list[tuple[Prompting, int]]:
    """Split ``room`` prompt tokens among the prompting slots by ``rule``
    (module doc; ``now``: the clock of ``t_start``, for srf's ageing).
    Returns (slot, tokens) in age order, only slots that get tokens."""
    if room <= 0 or not slots:
        return []
    if rule == "fair":
        return fair(slots, room, quantum)
    if rule == "fifo":
        order = sorted(slots, key=lambda s: s.t_start)
    else:  # srf: fewest tokens left first, each aged by its wait
        order = sorted(slots, key=lambda s: (s.remaining - AGE_TOKENS_S * max(now - s.t_start, 0.0), s.t_start))
    out = []
    for s in order:  # the head takes all it can; what it leaves goes to the next
        if room <= 0:
            break
        n = min(s.remaining, room)
        if n > 0:
            out.append((s, n))
            room -= n
    return sorted(out, key=lambda x: x[0].t_start)


def quick(left: int, cached: int, most: int) -> bool:
    """Is a prompt with ``left`` tokens to evaluate after ``cached`` reused
    ones one that ``express`` decodes alone (engine/preempt.py asks too)?"""
    return 0 < left <= min(most, cached)


def express(slots: Sequence[Prompting], most: int, cap: int) -> list[Prompting]:
    """The prompting slots decoded in a step of their own before the
    step's other rows: each with at most ``most`` tokens left and no more
    than it reused from the cache (a question after a cached document, a
    chat's next turn; not a new short prompt, so plain decode of unique
    requests runs as before), oldest first within ``cap`` tokens in all
    (the loop runs it only where generating rows or other prompts would
    share the step). Why: on the CPU a step costs about
    the sum of its rows (a generating row ~12-15 ms here, mostly its logits;
    a prompt token ~4-5 ms), so a short prompt riding a step waits for every
    other row too; alone it waits for its own, and the rows it leaves wait
    about what the shared step would have cost them (3 generating rows
    61-67 ms, a 22-token question alone 113-125 ms, both in one step
    163-184 ms; issue 24, docs/ARCHITECTURE.md)."""
    out, n = [], 0
    for s in sorted(slots, key=lambda s: s.t_start):
        k = s.remaining
        if quick(k, s.n_cache, most) and n + k <= cap:
            out.append(s)
            n += k
    return out


def fair(slots: Sequence[Prompting], room: int, quantum: int = QUANTUM) -> list[tuple[Prompting, int]]:
    """Water-filling, smallest remaining first (ties: oldest first): a slot
    needing less than an equal share takes just that and leaves the rest to
    the others, so a short prompt finishes in one step beside an 8k one, and
    two long prompts get equal chunks and progress together. No share is
    below ``quantum`` (tiny chunks waste a step's fixed cost): when the room
    cannot give every slot a quantum, the oldest slot goes first (it cannot
    starve), then the smallest. Leftover room goes to whoever still needs it.
    """
    order = sorted(slots, key=lambda s: (s.remaining, s.t_start))
    if room < quantum * len(order):
        oldest = min(order, key=lambda s: s.t_start)
        order.remove(oldest)
        order.insert(0, oldest)
    give = {s.id: 0 for s in order}
    k = len(order)
    for i, s in enumerate(order):
        if room <= 0:
            break
        share = max(room // (k - i), min(quantum, room))
        n = min(s.remaining, share)
        give[s.id] = n
        room -= n
    for s in order:
        if room <= 0:
            break
        n = min(s.remaining - give[s.id], room)
        give[s.id] += n
        room -= n
    return [(s, give[s.id]) for s in sorted(order, key=lambda s: s.t_start) if give[s.id] > 0]
