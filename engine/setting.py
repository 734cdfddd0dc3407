"""How a Config field is declared as a setting, and the value types of the flags.

engine/config.py declares every setting with ``setting(...)``; the
functions here are argparse ``type=`` callables: each turns one flag's text
into its value or raises ValueError, which the parser reports as a usage
error naming the flag (a bad value fails at start, never later). The name
tables (KV_TYPES, LOAD_MODES, ...) map llama-server's values to libllama's
enums, read by the engine (engine/llamaparams.py, engine/model.py).
Imports nothing of the engine at module level (engine/kvevents.py and
engine/spec/ are imported inside the two checks that use them).
"""
from __future__ import annotations

import argparse
import math
import os
import re
from dataclasses import field
from typing import Any

from ipc import chain

ENGINE, WORKERS, LAUNCHER = "engine", "workers", "launcher"  # workers: the gunicorn master and its workers


def setting(default: Any, *flags: str, used: str, help: str = "", lo: Any = None,
            file: str = "", env: str = "", **arg: Any) -> Any:
    """A Config field that is a setting.

    default: a value, or a function of no arguments computing it per
    Config; flags: option strings (none: not on the command line); used: the
    processes that read it, space separated; help: None hides the flag from
    --help (argparse.SUPPRESS); lo: values below are raised to it; file: a
    flag naming a file whose content the value takes (api keys: appended);
    env: a variable that, when set, replaces the default on the command
    line; arg: further argparse keywords (type, action, nargs, const;
    action "store_bool" = --flag / --no-flag)."""
    meta = {"flags": flags, "used": tuple(used.split()), "help": help, "lo": lo, "file": file, "env": env,
            "arg": arg}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    if callable(default):  # computed per Config (e.g. from the host's cores)
        return field(default_factory=default, metadata=meta)
    return field(default=default, metadata=meta)


def on_off(v: str) -> str:
    """llama-server's on/off/auto values (with its aliases)."""
    v = v.lower()
    if v in ("on", "off", "auto"):
        return v
    if v in ("1", "true", "enabled"):
        return "on"
    if v in ("0", "false", "disabled"):
        return "off"
    raise ValueError("expected on, off or auto")


POOLING = ("none", "mean", "cls", "last", "rank")  # llama_pooling_type 0..4, llama-server's --pooling names


def gpu_layers(v: str) -> int:
    return {"auto": -1, "all": 999}[v] if v in ("auto", "all") else int(v)


def directory(v: str) -> str:
    """An existing directory, made absolute (llama-server refuses to start otherwise)."""
    if not os.path.isdir(v):
        raise ValueError(f"not a directory: {v}")
    return os.path.abspath(v)


def kv_events(v: str) -> str:
    """--kv-events-config: checked here (a bad value is a usage error naming the flag), parsed by the engine."""
    from engine.kvevents import parse

    parse(v)
    return v


def spec_types(v: str) -> str:
    """--spec-type: checked here (a usage error naming the flag), run by engine/spec/."""
    from engine.spec import spec_types as check

    return check(v)


def idle_seconds(v: str) -> int:
    """--sleep-idle-seconds: -1 or a positive count (common/arg.cpp refuses 0 and below -1)."""
    n = int(v)
    if n == 0 or n < -1:
        raise ValueError("invalid value: cannot be 0 or less than -1")
    return n


def csv_list(v: str) -> list[str]:
    return [k.strip() for k in v.split(",") if k.strip()]


# -ctk/-ctv values (common/arg.cpp kv_cache_types) -> ggml_type, and the bytes of one element (block size / elements)
KV_TYPES = {"f32": (0, 4.0), "f16": (1, 2.0), "bf16": (30, 2.0), "q8_0": (8, 34 / 32), "q4_0": (2, 18 / 32),
            "q4_1": (3, 20 / 32), "iq4_nl": (20, 18 / 32), "q5_0": (6, 22 / 32), "q5_1": (7, 24 / 32)}
LOAD_MODES = ("auto", "none", "mmap", "mlock", "mmap+mlock", "dio")  # -lm: llama_load_mode -1..4
SPLIT_MODES = ("none", "layer", "row", "tensor")  # -sm: llama_split_mode 0..3
NUMA = ("distribute", "isolate", "numactl")  # --numa: ggml_numa_strategy 1..3


def kv_type(v: str) -> str:
    if v.lower() not in KV_TYPES:
        raise ValueError(f"Unsupported cache type: {v} (allowed: {', '.join(KV_TYPES)})")
    return v.lower()


def device_list(v: str) -> str:
    """-dev: "none" or comma-separated device names; the engine resolves the names (engine/devices.py)."""
    if not csv_list(v):
        raise ValueError("no devices specified")
    return ",".join(csv_list(v))


def proportions(v: str) -> list[float]:
    """-ts 3,1 (or 3/1): one proportion per device, as common/arg.cpp reads them."""
    return [float(x) for x in re.split(r"[,/]+", v) if x]


E, W, L, EW, EWL = ENGINE, WORKERS, LAUNCHER, f"{ENGINE} {WORKERS}", f"{ENGINE} {WORKERS} {LAUNCHER}"


class SamplerOrder(argparse.Action):
    """``--samplers`` (names separated by ';') or ``--sampler-seq`` /
    ``--sampling-seq`` (sampler chars): ipc/chain.py's stage chars, the last
    flag winning; unknown names or chars are skipped, as llama.cpp does."""

    def __call__(self, parser, ns, value, option_string=None):
        setattr(ns, self.dest, chain.from_names(value.split(";")) if option_string == "--samplers"
                else chain.from_chars(value))


class Breakers(argparse.Action):
    """``--dry-sequence-breaker``, repeated: the first use clears the
    defaults, ``none`` clears all (common/arg.cpp)."""

    def __call__(self, parser, ns, value, option_string=None):
        cur = list(getattr(ns, self.dest, None) or [])  # absent (argparse.SUPPRESS): the defaults are gone
        setattr(ns, self.dest, [] if value == "none" else cur + [value])


def count(v: str) -> int:
    """An integer >= 0 (llama-server refuses a negative --repeat-last-n)."""
    n = int(v)
    if n < 0:
        raise ValueError("must be >= 0")
    return n


def finite(v: str) -> float:
    """A finite float (--presence-penalty, --frequency-penalty)."""
    x = float(v)
    if not math.isfinite(x):
        raise ValueError("must be finite")
    return x


def dry_base(v: str) -> float:
    """--dry-base: a value below 1 leaves the default (common/arg.cpp ignores it)."""
    x = float(v)
    return x if x >= 1.0 else 1.75


def penalty(v: str) -> float:
    """--repeat-penalty: finite, > 0, with a finite inverse (common/arg.cpp)."""
    x = finite(v)
    if x <= 0 or not math.isfinite(1.0 / x):
        raise ValueError("must be finite and greater than 0")
    return x


def default_workers(cores: int | None = None) -> int:
    """gunicorn workers when -w is not given: max(2, min(cores // 2, 8)).

    Why: HTTP work (detokenizing, SSE framing, JSON) costs each output token
    0.23 ms of a worker's CPU at 8 streams and 0.52 ms at 32 (bench_serving's
    CPU-by-role table, 2-core VM, 2026-12-01), and one worker process is one
    core at most (the GIL). On a GPU host decoding ~13-20k tokens/s at 128
    streams that is 3-10 cores of HTTP work, so
    the workers must scale with the host: half the cores leaves the other
    half to the engine (one busy core), the load balancer and the kernel;
    8 covers ~13-40k tokens/s; 2 is the floor (a worker can be replaced
    while the other serves). On this project's 2-core VM: 2, as before."""
    n = cores if cores is not None else (os.cpu_count() or 2)
    return max(2, min(n // 2, 8))
