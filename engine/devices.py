"""ggml's backend devices and NUMA setup, for the flags that pick them.

libllama has no call to look a device up by name; ggml's registry does
(``ggml_backend_dev_by_name``), reached here through libllama's handle
(dlsym searches the libraries libllama loaded: libggml, libggml-base). Only
the engine process calls these (after ``init_backend``).
"""
from __future__ import annotations

import ctypes

import llama_cpp as L

from engine.setting import NUMA
from engine.vocab import ModelError

DEV_CPU = 0  # enum ggml_backend_dev_type: GGML_BACKEND_DEVICE_TYPE_CPU
_lib = L.llama_cpp._lib
_lib.ggml_backend_load_all.restype = None
_lib.ggml_backend_dev_count.restype = ctypes.c_size_t
_lib.ggml_backend_dev_get.restype = ctypes.c_void_p
_lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
_lib.ggml_backend_dev_by_name.restype = ctypes.c_void_p
_lib.ggml_backend_dev_by_name.argtypes = [ctypes.c_char_p]
_lib.ggml_backend_dev_name.restype = ctypes.c_char_p
_lib.ggml_backend_dev_name.argtypes = [ctypes.c_void_p]
_lib.ggml_backend_dev_description.restype = ctypes.c_char_p
_lib.ggml_backend_dev_description.argtypes = [ctypes.c_void_p]
_lib.ggml_backend_dev_type.restype = ctypes.c_int
_lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
_numa_done: list[str] = []  # ggml_numa_init runs once per process (a second call only warns)


def device_array(value: str):
    """-dev as llama_model_params.devices: a NULL-terminated array of
    ggml_backend_dev_t (common/arg.cpp parse_device_list): "none" is an
    empty list (nothing offloaded); a name that is not a non-CPU device of
    this build raises ModelError("invalid device: X"). None for "" (every
    device, llama.cpp's default). The caller keeps the array alive while
    the model loads."""
    if not value:
        return None
    names = [n for n in value.split(",") if n]
    if names == ["none"]:
        return (ctypes.c_void_p * 1)()
    _lib.ggml_backend_load_all()
    devs = []
    for name in names:
        d = _lib.ggml_backend_dev_by_name(name.encode())
        if not d or _lib.ggml_backend_dev_type(d) == DEV_CPU:
            raise ModelError(f"invalid device: {name}")
        devs.append(d)
    return (ctypes.c_void_p * (len(devs) + 1))(*devs, None)


def names(arr) -> list[str]:
    """The device names of a NULL-terminated device array (a `device_array`
    or llama_model_params.devices read back), for the engine's log."""
    out: list[str] = []
    while arr[len(out)]:
        out.append(_lib.ggml_backend_dev_name(arr[len(out)]).decode())
    return out


def available() -> list[tuple[str, str]]:
    """(name, description) of every non-CPU device (llama-server --list-devices)."""
    _lib.ggml_backend_load_all()
    out = []
    for i in range(_lib.ggml_backend_dev_count()):
        d = _lib.ggml_backend_dev_get(i)
        if _lib.ggml_backend_dev_type(d) != DEV_CPU:
            out.append((_lib.ggml_backend_dev_name(d).decode(), _lib.ggml_backend_dev_description(d).decode()))
    return out


def numa_init(strategy: str) -> str:
    """--numa: llama_numa_init once, before the model loads (as llama-server
    after llama_backend_init); returns the strategy in effect ("" none)."""
    if strategy and not _numa_done:
        L.llama_numa_init(NUMA.index(strategy) + 1)  # GGML_NUMA_STRATEGY_DISTRIBUTE=1, ISOLATE=2, NUMACTL=3
        _numa_done.append(strategy)
    return _numa_done[0] if _numa_done else ""
