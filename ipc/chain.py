"""The sampler-chain header a request may put first in the channel's grammar
area: the order of the chain's stages (llama-server's ``samplers``) and
DRY's sequence breakers (``dry_sequence_breakers``), the two structured
sampling fields that fit no PARAMS row. The workers build it
(frontends/text/params.py), engine/sampling/ reads it.

It starts with a NUL byte, as ipc/budget.py's header does (no GBNF holds
one); a grammar area without it is llama-server's default order and
breakers. Layout: ``MAGIC``, the number of stages (u16), one code byte
each (common/sampling.cpp's sampler chars: ``STAGES``), the number of
breakers (u16), then each breaker as a u16 length and its bytes (UTF-8 as
the request sent it, at most ``BREAKER_BYTES``: llama.cpp's
llama_sampler_init_dry truncates a longer one to as many bytes). The budget
header and the GBNF follow; the whole area is bounded by MAX_GRAMMAR.
Lowest layer: struct only.
"""
from __future__ import annotations

import struct
from typing import Sequence

MAGIC = b"\0SC1"
# common_sampler_type_to_chr: the chars llama-server reads from a "samplers" string
STAGES = {"dry": "d", "top_k": "k", "typ_p": "y", "top_p": "p", "top_n_sigma": "s", "min_p": "m",
          "temperature": "t", "xtc": "x", "infill": "i", "penalties": "e", "adaptive_p": "a"}
NAMES = {c: n for n, c in STAGES.items()}
ORDER = "edskypmxt"  # llama-server's default: penalties, dry, top_n_sigma, top_k, typ_p, top_p, min_p, xtc, temperature
BREAKERS = ("\n", ":", "\"", "*")  # common_params_sampling's default dry_sequence_breakers
BREAKER_BYTES = 40  # llama-sampler.cpp's MAX_CHAR_LEN: a breaker is cut to its first 40 bytes
_HEAD = struct.Struct("<4sH")
# The first bytes of a grammar area that /slots reads for a running request's order
# (frontends/api/misc.py): the header's head and up to 512 stage chars. Only repeated stages make a
# longer order; /slots shows the server's order for one.
PEEK = _HEAD.size + 512
# common_sampler_types_from_names: the canonical names, their kebab-case and no-dash spellings, three more
ALIASES = {**{a: n for n in STAGES for a in (n, n.replace("_", "-"), n.replace("_", ""))},
           "nucleus": "top_p", "temp": "temperature", "typ": "typ_p"}


def from_names(names: Sequence[str]) -> str:
    """Stage chars of sampler names, case-insensitive; an unknown one is
    skipped (llama.cpp logs a warning and goes on)."""
    return "".join(STAGES[ALIASES[x.lower()]] for x in names if x.lower() in ALIASES)


def from_chars(chars: str) -> str:
    """The known stage chars of a ``--sampler-seq`` string, in order."""
    return "".join(c for c in chars if c in NAMES)


def pack(order: str, breakers: Sequence[str]) -> bytes:
    """The header for a chain in ``order`` (stage chars) with DRY's ``breakers``
    (each cut to BREAKER_BYTES, as llama.cpp cuts it). ValueError past the
    u16 counts (the caller's 400; the area is far smaller anyway)."""
    if len(order) > 0xFFFF or len(breakers) > 0xFFFF:
        raise ValueError("too many sampler stages or DRY sequence breakers")
    out = [_HEAD.pack(MAGIC, len(order)), order.encode("ascii"), struct.pack("<H", len(breakers))]
    for b in breakers:
        raw = b.encode("utf-8", "surrogatepass")[:BREAKER_BYTES]
        out.append(struct.pack("<H", len(raw)) + raw)
    return b"".join(out)


def order_of(head: bytes) -> str | None:
    """The stage chars of a header at the start of ``head`` (the first
    bytes of a grammar area suffice: what /slots shows), None without one."""
    if not head.startswith(MAGIC) or len(head) < _HEAD.size:
        return None
    _, n = _HEAD.unpack_from(head)
    order = head[_HEAD.size:_HEAD.size + n].decode("ascii", "replace")
    return order if len(order) == n and all(c in NAMES for c in order) else None


def unpack(area: bytes) -> tuple[tuple[str, tuple[bytes, ...]] | None, bytes]:
    """((order, breakers as bytes) or None, what follows). A malformed
    header is a ValueError (the engine answers 400)."""
    if not area.startswith(MAGIC):
        return None, area
    try:
        order = order_of(area)
        if order is None:
            raise ValueError
        at = _HEAD.size + len(order)
        (nb,) = struct.unpack_from("<H", area, at)
        at += 2
        breakers = []
        for _ in range(nb):
            (k,) = struct.unpack_from("<H", area, at)
            raw = area[at + 2:at + 2 + k]
            if len(raw) != k:
                raise ValueError
            breakers.append(bytes(raw))
            at += 2 + k
    except (struct.error, UnicodeDecodeError, ValueError):
        raise ValueError("malformed sampler chain header") from None
    return (order, tuple(breakers)), area[at:]
