"""The reasoning-budget header a request may put ahead of its GBNF in the
channel's grammar area (engine/sampling/budget.py runs it; the workers
build it, frontends/api/openai.py).

It starts with a NUL byte, which no GBNF does, so a grammar area without
it is a plain grammar: ``MAGIC``, the budget (tokens), the lengths of
four token sequences -- start marker, end marker, forced, and the prefill
(the generation prompt's tokens, which the sampler accepts first, as
llama.cpp's common_sampler_init does: a template that opens ``<think>``
starts the count there) -- then the int32 ids. Lowest layer: struct only.
"""
from __future__ import annotations

import struct
from typing import Sequence

IDLE, COUNTING, FORCING, WAITING_UTF8, DONE = range(5)
UNLIMITED = 2**31 - 1  # llama.cpp's INT_MAX budget: the header only holds a lazy grammar off while thinking
MAGIC = b"\0RB1"
_HEAD = struct.Struct("<4siHHHH")


def pack(budget: int, start: Sequence[int], end: Sequence[int], forced: Sequence[int],
         prefill: Sequence[int] = ()) -> bytes:
    """The header, to be put ahead of the request's grammar."""
    seqs = [*start, *end, *forced, *prefill]
    return _HEAD.pack(MAGIC, budget, len(start), len(end), len(forced), len(prefill)) \
        + struct.pack(f"<{len(seqs)}i", *seqs)


def unpack(grammar: bytes) -> tuple[tuple | None, bytes]:
    """(budget spec or None, the GBNF that follows). A malformed header is
    a ValueError (the engine answers 400)."""
    if not grammar.startswith(MAGIC):
        return None, grammar
    if len(grammar) < _HEAD.size:
        raise ValueError("truncated reasoning budget header")
    _, budget, ns, ne, nf, npre = _HEAD.unpack_from(grammar)
    n = ns + ne + nf + npre
    end = _HEAD.size + 4 * n
    if len(grammar) < end or not ns or not ne or budget < 0:
        raise ValueError("malformed reasoning budget header")
    ids = struct.unpack_from(f"<{n}i", grammar, _HEAD.size)
    a, b, c = ns, ns + ne, ns + ne + nf
    return (budget, ids[:a], ids[a:b], ids[b:c], ids[c:]), grammar[end:]
