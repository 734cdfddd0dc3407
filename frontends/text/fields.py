"""Typed readers of request JSON fields: each returns the field or its
default, and raises llama-server's 400 when the value has the wrong type or
lies out of bounds. ``null`` counts as absent, like llama-server's
``json_value``. Shared by the parameter plan (params.py), chat templates and
every API family."""
from __future__ import annotations

import math

from ipc.params import F32, I32

from .errors import bad


def pick(body: dict, *keys: str):
    """(key, value) of the first key present and not null, else (None, None)."""
    for k in keys:
        v = body.get(k)
        if v is not None:
            return k, v
    return None, None


def get_int(body: dict, keys, default: int, lo: int = -I32 - 1, hi: int = I32) -> int:
    k, v = pick(body, *((keys,) if isinstance(keys, str) else keys))
    if k is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
        raise bad(f"Field '{k}': expected an integer")
    v = int(v)
    if not lo <= v <= hi:
        raise bad(f"Field '{k}': Value must be between {lo} and {hi}")
    return v


def get_float(body: dict, keys, default: float, lo: float = -F32, hi: float = F32) -> float:
    k, v = pick(body, *((keys,) if isinstance(keys, str) else keys))
    if k is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise bad(f"Field '{k}': expected a number")
    if not lo <= v <= hi:
        raise bad(f"Field '{k}': Value must be between {lo} and {hi}")
    return float(v)


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
