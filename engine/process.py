"""Start and stop an engine process over a fresh arena.

Used by the launcher, the tests and the benchmarks, so there is one way to
bring an engine up: sweep, create the arena sized from the config, store the
config, spawn ``python -m engine``, wait for ready (or failed).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from ipc.arena import Arena, Geometry
from ipc.layout import ST_FAILED, ST_READY

from .config import Config


def geometry(cfg: Config, n_ctx_slot: int, n_workers: int | None = None) -> Geometry:
    """Arena sizes for a config: 2x gunicorn workers (SIGHUP overlap, plus
    room for TTIN), a channel per gunicorn thread, prompts up to a slot."""
    return Geometry(n_workers=n_workers or 2 * cfg.workers + 2, n_chan=cfg.http_threads,
                    ring_cap=cfg.ring_cap, max_prompt=n_ctx_slot, n_slots=cfg.parallel)


def n_ctx_train(path: str) -> int:
    """The model's training context, from a vocab-only load (fast)."""
    import llama_cpp

    llama_cpp.llama_backend_init()
    p = llama_cpp.llama_model_default_params()
    p.vocab_only = True
    m = llama_cpp.llama_model_load_from_file(path.encode(), p)
    if not m:
        raise RuntimeError(f"cannot load model {path}")
    try:
        return int(llama_cpp.llama_model_n_ctx_train(m))
    finally:
        llama_cpp.llama_model_free(m)


def slot_ctx(cfg: Config) -> int:
    """Per-slot context as llama.cpp will size it (ctx 0 = training context)."""
    n_ctx = cfg.ctx_size or n_ctx_train(cfg.model_path())
    return max(n_ctx // max(cfg.parallel, 1), 1)


class EngineProcess:
    """An engine child and the arena it serves. ``stop()`` ends both."""

    def __init__(self, cfg: Config, n_workers: int | None = None, arena: Arena | None = None):
        if not cfg.model:
            cfg.model = cfg.model_path()
        if arena is None:
            Arena.sweep()
            arena = Arena.create(geometry(cfg, slot_ctx(cfg), n_workers))
        self.arena = arena
        cfg.arena = arena.instance
        arena.set_config(cfg.to_json())
        self.cfg = cfg
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 120.0) -> "EngineProcess":
        self.proc = subprocess.Popen([sys.executable, "-m", "engine", "--arena", self.arena.instance],
                                     cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        deadline = time.monotonic() + timeout
        epoch = self.arena.get("epoch")
        while time.monotonic() < deadline:
            st = self.arena.state
            if self.arena.get("epoch") != epoch and st == ST_READY:
                return self
            if st == ST_FAILED or self.proc.poll() is not None:
                raise RuntimeError(f"engine failed: {self.arena.get('reason').decode()}")
            time.sleep(0.02)
        raise TimeoutError("engine did not become ready")

    def stop(self, timeout: float = 5.0) -> int | None:
        rc = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                rc = self.proc.wait()
        elif self.proc is not None:
            rc = self.proc.returncode
        return rc

    def close(self) -> None:
        """Stop the engine, unmap and unlink the arena."""
        self.stop()
        self.arena.close()
        self.arena.unlink()

    def __enter__(self) -> "EngineProcess":
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc) -> None:
        self.close()
