"""Typed readers of request JSON fields: each returns the field or its
default, and raises llama-server's 400 when the value has the wrong type or
lies outside hard bounds. ``null`` counts as absent, like llama-server's
``json_value``. Shared by the parameter plan (params.py), chat templates and
every API family.

Numbers are read as llama-server reads them (server-schema.h field_num:
nlohmann's ``get<T>``, then server-schema.cpp field_num::eval's limits):
``number`` converts to the record type (a float truncated toward zero for an
integer, a boolean 0/1, an integer wrapped to 32 bits, a float beyond the
float range infinite), ``bound`` clamps (set_limits) or refuses
(set_hard_limits)."""
from __future__ import annotations

import math
import struct

from ipc.params import I32

from .errors import bad

FLT_MAX = 3.4028234663852886e38  # std::numeric_limits<float>::max(): field_num's default limits
_NAMES = {str: "string", list: "array", dict: "object", type(None): "null"}


def pick(body: dict, *keys: str):
    """(key, value) of the first key present and not null, else (None, None)."""
    for k in keys:
        v = body.get(k)
        if v is not None:
            return k, v
    return None, None


def _trunc(x: float, signed: bool) -> int:
    """static_cast of a double on x86-64: toward zero; out of range, an int32
    is INT32_MIN (cvttsd2si's 'indefinite'), a uint32 the low bits of the
    int64 conversion (0 past int64)."""
    t = math.trunc(x)
    if signed:
        return t if -2**31 <= t < 2**31 else -2**31
    return t % 2**32 if -2**63 <= t < 2**63 else 0


def number(k: str, v, code: str = "<i4"):
    """nlohmann's get<T> of a JSON value for the record type ``code`` ("<i4"
    int32, "<u4" uint32, "<f4" float); a 400 for a string, array, object
    (type_error 302, as llama-server's handle_with_catch words it)."""
    if isinstance(v, bool):
        v = int(v)
    elif not isinstance(v, (int, float)):
        raise bad(f"Field '{k}': [json.exception.type_error.302] type must be number, but is "
                  f"{_NAMES.get(type(v), 'string')}")
    elif isinstance(v, float) and not math.isfinite(v):  # not JSON: nlohmann's parser refuses it
        raise bad(f"Field '{k}': expected a finite number")
    elif isinstance(v, int) and not -2**63 <= v < 2**64:
        v = float(v) if abs(v) < 2**1000 else math.copysign(math.inf, v)  # nlohmann: a double
    if code == "<f4":
        try:
            struct.pack("<f", v)  # std::static_cast<float>: beyond the float range, infinite
        except OverflowError:
            return math.copysign(math.inf, v)
        return float(v)
    if isinstance(v, float):
        return _trunc(v, code == "<i4")
    return (v + 2**31) % 2**32 - 2**31 if code == "<i4" else v % 2**32  # int64 -> int32 / uint32: wraps


def _show(x) -> str:
    return str(x) if isinstance(x, int) else f"{x:f}"  # std::to_string: "%d" / "%f"


def bound(k: str, v, lo, hi, soft: bool):
    """field_num::eval: ``soft`` clamps into lo..hi (std::max(min, std::min(max, v)));
    else a value outside is llama-server's 400."""
    if soft:
        return max(lo, min(hi, v))
    if not lo <= v <= hi:
        raise bad(f"Field '{k}': Value must be between {_show(lo)} <= value <= {_show(hi)}, but got {_show(v)}")
    return v


def get_num(body: dict, keys, default, code: str = "<i4", lo=None, hi=None, soft: bool = False):
    """A number field (first key present), converted as ``number`` and bounded
    as ``bound``; None bounds are the type's (floats: +-FLT_MAX, so an
    unbounded float beyond it is FLT_MAX, as field_num's default limits)."""
    k, v = pick(body, *((keys,) if isinstance(keys, str) else keys))
    if k is None:
        return default
    v = number(k, v, code)
    if code == "<f4":
        return bound(k, v, -FLT_MAX if lo is None else lo, FLT_MAX if hi is None else hi, soft or lo is hi is None)
    if code == "<u4":
        return bound(k, v, 0 if lo is None else lo, 2**32 - 1 if hi is None else hi, soft)
    return bound(k, v, -I32 - 1 if lo is None else lo, I32 if hi is None else hi, soft)


def get_int(body: dict, keys, default: int, lo: int = -I32 - 1, hi: int = I32) -> int:
    """An int32 field with hard bounds (set_hard_limits)."""
    return get_num(body, keys, default, "<i4", lo, hi)


def get_float(body: dict, keys, default: float, lo: float | None = None, hi: float | None = None) -> float:
    """A float field with hard bounds (set_hard_limits); unbounded: clamped to +-FLT_MAX."""
    return get_num(body, keys, default, "<f4", lo, hi)


def get_bool(body: dict, key: str, default: bool) -> bool:
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad(f"Field '{key}': expected a boolean")
    return v


def get_str(body: dict, key: str, default: str = "") -> str:
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, str):
        raise bad(f"Field '{key}': expected a string")
    return v
