"""llama_model_params and llama_context_params from the Config, and back.

`model_params` applies the flags that reach the model (-ngl, -dev, -sm, -ts,
-mg, -lm / --mlock / --no-mmap); engine/model.py sets the context's (-c,
-np, -b, -ub, -t, -tb, -fa, -ctk, -ctv) where it builds the context. The
``*_dict`` functions read the structs back: what llama.cpp was handed, for
the engine's ``llama params`` log line and the tests that check each flag
reaches llama.cpp (tests/test_llama_params.py).
"""
from __future__ import annotations

import ctypes

import llama_cpp as L

from engine import devices
from engine.config import Config
from engine.setting import KV_TYPES, LOAD_MODES, SPLIT_MODES
from engine.vocab import ModelError

FLASH_ATTN = {  # cfg.flash_attn -> llama_flash_attn_type, as llama-server's -fa
    "on": L.LLAMA_FLASH_ATTN_TYPE_ENABLED,  # 1
    "off": L.LLAMA_FLASH_ATTN_TYPE_DISABLED,  # 0
    "auto": L.LLAMA_FLASH_ATTN_TYPE_AUTO,  # -1: on where the device supports it (CPU: yes)
}


def model_params(cfg: Config):
    """llama_model_params for the flags that reach them (-ngl, -dev, -sm,
    -ts, -mg, -lm / --mlock / --no-mmap), and the ctypes arrays they point
    at (keep them alive while the model loads)."""
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = cfg.n_gpu_layers
    # -lm auto (the default) is llama-server's: mmap where every device supports it (the weights of
    # offloaded layers are copied out and their pages unmapped after the load; nothing keeps a pointer in)
    mp.load_mode = LOAD_MODES.index(load_mode(cfg)) - 1  # llama_load_mode: auto -1, none 0, ..., dio 4
    mp.split_mode = SPLIT_MODES.index(cfg.split_mode)
    mp.main_gpu = cfg.main_gpu
    keep = []
    if cfg.device:
        arr = devices.device_array(cfg.device)
        mp.devices = ctypes.cast(arr, ctypes.c_void_p).value
        keep.append(arr)
    if cfg.tensor_split:
        n = L.llama_max_devices()
        if len(cfg.tensor_split) >= n:  # common/arg.cpp's check
            raise ModelError(f"got {len(cfg.tensor_split)} input configs, but system only has {n} devices")
        ts = (ctypes.c_float * n)(*cfg.tensor_split)
        mp.tensor_split = ctypes.cast(ts, ctypes.POINTER(ctypes.c_float))
        keep.append(ts)
    return mp, keep


def load_mode(cfg: Config) -> str:
    """-lm as given; else the older --no-mmap / --mlock spelled as a load mode."""
    if cfg.load_mode != "auto" or (cfg.mmap and not cfg.mlock):
        return cfg.load_mode
    if not cfg.mmap:
        return "mlock" if cfg.mlock else "none"
    return "mmap+mlock"


def model_params_dict(mp) -> dict:
    """What llama.cpp was handed (the engine logs it; tests check each flag reached it)."""
    ts = [float(mp.tensor_split[i]) for i in range(L.llama_max_devices())] if mp.tensor_split else []
    while ts and ts[-1] == 0:
        ts.pop()
    dev = devices.names(ctypes.cast(mp.devices, ctypes.POINTER(ctypes.c_void_p))) if mp.devices else None
    return {"n_gpu_layers": mp.n_gpu_layers, "load_mode": LOAD_MODES[mp.load_mode + 1],
            "split_mode": SPLIT_MODES[mp.split_mode], "main_gpu": mp.main_gpu, "tensor_split": ts,
            "devices": "all" if dev is None else ",".join(dev) or "none"}


def context_params_dict(cp) -> dict:
    types = {v[0]: k for k, v in KV_TYPES.items()}
    return {"n_ctx": cp.n_ctx, "n_batch": cp.n_batch, "n_ubatch": cp.n_ubatch, "n_seq_max": cp.n_seq_max,
            "n_threads": cp.n_threads, "n_threads_batch": cp.n_threads_batch,
            "flash_attn": {v: k for k, v in FLASH_ATTN.items()}[cp.flash_attn_type],
            "type_k": types[cp.type_k], "type_v": types[cp.type_v]}
