"""Dropping a rejected draft: the KV and the slot's token list keep the accepted prefix.

The loop (engine/loop.py sample) samples a slot's positions in order (the
last token's, then each drafted token's) with the slot's own sampler and
stops at the first token that differs from the draft (or ends the request).
With q tokens sampled, the last token and the first q - 1 drafted ones were
right: their KV stays, the rest is removed here before any token of the
step is published or the slot's entry in the prefix tree can be updated,
so ``cache[:n_past]`` is exactly the KV again (engine/slots.py invariant)
and a rejected token never reaches the prefix cache (engine/kvcache.py
reads ``cache[:n_past]`` only).
"""
from __future__ import annotations


def cut(model, s, keep: int) -> bool:
    """Keep the first ``keep`` tokens of slot ``s``'s sequence; False if
    llama.cpp refused the partial removal (the sequence is then cleared and
    n_past is 0: the request must end)."""
    if keep < s.n_past:
        if not model.seq_rm(s.id, keep, -1):
            model.seq_clear(s.id)
            s.n_past = 0
            return False
        s.n_past = keep
    return True
