"""The weights: one llama_model loaded from the Config, before any context.

Why apart from engine/model.py's ``Model``: on a host whose libllama offloads
nothing (no GPU backend in the build), the ``ringserve`` launcher loads the
weights itself and forks the engine from them (frontends/process/procs.py),
and the gunicorn master after it: the engine, the master and every worker then
share one copy of what the load built on the heap (the vocabulary: ~40 MiB for
Gemma 3's 262k tokens, and the EOG mask) and of the model's buffers,
copy-on-write, where an exec'd engine loaded its own and the HTTP side a
second one (issue 26's PSS). ``Model(cfg, weights)`` then only creates the
context.

Invariants: a ``Weights`` is never written after ``__init__`` (llama.cpp
reads a model from many contexts; nothing here mutates it), so its pages stay
shared in every forked child; only its owner frees it (``close``), and a
forked engine does not (``Model.close`` frees only weights it loaded).
The load starts no thread and creates no libllama context or thread pool
(checked: the launcher's threads are its main one and OpenBLAS's, which
OpenBLAS itself stops across ``fork``), so forking after it is safe.
"""
from __future__ import annotations

import os
import re

import llama_cpp as L

from engine import devices
from engine.config import Config
from engine.crashdump import crash_point
from engine.llamaparams import model_params, model_params_dict
from engine.vocab import ModelError, Vocab, init_backend, log_tail


class Weights:
    """A loaded model (``model``), its ``vocab``, what llama.cpp was handed (``params``)."""

    def __init__(self, cfg: Config) -> None:
        init_backend()
        path = cfg.model_path()
        if not os.path.exists(path):
            raise ModelError(f"model file not found: {path}")
        numa = devices.numa_init(cfg.numa)
        mp, keep = model_params(cfg)  # keep: the ctypes arrays mp points at, alive through the load
        self.params = {"numa": numa or "none", **model_params_dict(mp)}
        self.path = path
        crash_point("load")
        model = L.llama_model_load_from_file(os.fsencode(path), mp)
        del keep
        if not model:
            raise ModelError(f"failed to load model {path!r}: {log_tail(4)}")
        self.model = model
        self.vocab = Vocab(model, own=True, path=path)
        self.vocab.eog_mask  # built now (~80 ms of C calls): inherited by a forked engine, not rebuilt there

    def close(self) -> None:
        """Free the model (its owner only). Idempotent."""
        self.vocab.close()
        self.model = None


CPU_ONLY = re.compile(r"libggml(-base|-cpu[-\w]*)?\.so")  # the libraries of a build that offloads nothing


def offloads() -> list[str]:
    """The ggml backend libraries of this llama-cpp-python besides the CPU's
    (libggml-cuda.so, -vulkan, -metal, -rpc, ...): linked into libggml or
    loadable by ggml_backend_load_all, they sit beside libllama. Read from the
    directory, not from ggml's device registry: registering a CUDA backend
    initialises the CUDA runtime in the calling process."""
    lib = os.path.join(os.path.dirname(os.path.abspath(L.__file__)), "lib")
    try:
        names = os.listdir(lib)
    except OSError:
        return []
    return sorted(n for n in names if n.startswith("libggml") and ".so" in n
                  and not CPU_ONLY.fullmatch(n.split(".so")[0] + ".so"))


def forkable(cfg: Config) -> bool:
    """May the launcher load the weights and fork the engine from them?

    Not where the engine must start from a clean process: a build with a
    backend that can offload (``offloads``: a device runtime that the load
    would initialise does not survive fork, and the launcher would hold
    device memory), a replaced engine command (tests' fake engine), or
    ``--sleep-idle-seconds`` (the engine frees its model while it sleeps;
    the launcher's copy would stay). ``--engine-start exec`` asks for an
    exec'd engine anyway."""
    if cfg.engine_start == "exec" or cfg.engine_cmd or cfg.sleep_idle_seconds > 0:
        return False
    return not offloads()
