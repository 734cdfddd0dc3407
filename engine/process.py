"""Arena set-up from a config, and a simple engine child over it.

Why one module: the ``ringserve`` supervisor and a plain gunicorn master
(frontends/process/procs.py, launcher.py, hooks.py), the tests and the benchmarks
must size and fill an arena the same way, or the tests would exercise a
differently shaped server. So there is one way: ``prepare`` the config
(model path, ``-c 0`` resolved), ``create_arena`` (sweep, create it sized by
``Geometry.sized``), ``child_env`` (the Config's one way into a child), and for tests and benchmarks
``EngineProcess``: spawn ``python -m engine``, wait for ready (or failed).
"""
from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import sys
import time

from ipc.arena import Arena, Geometry
from ipc.layout import ST_FAILED, ST_READY

from .config import Config
from .gguf import context_length, embedding_length

log = logging.getLogger("ringserve")  # the supervisor's log: tests find "arena rs_..." in it


def prepare(cfg: Config) -> Config:
    """Resolve what the arena's size depends on: the model file and, for
    ``-c 0``, the model's training context (read from the GGUF header)."""
    cfg.model = cfg.model_path()
    if cfg.ctx_size <= 0:
        cfg.ctx_size = context_length(cfg.model) or 4096
    return cfg


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the tree holding engine/, ipc/, frontends/


def child_env(cfg: Config, extra: dict | None = None) -> dict:
    """The environment of every ringserve child (engine, gunicorn master and
    so its workers): the one way the Config reaches a process, as JSON in
    RINGSERVE_CONFIG (read back with Config.from_json)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["RINGSERVE_ARENA"] = cfg.arena
    env["RINGSERVE_CONFIG"] = cfg.to_json()
    env.update(extra or {})
    return env


def create_arena(cfg: Config, n_workers: int | None = None) -> Arena:
    """Sweep dead instances, create an arena sized for a ``prepare``d config
    and record it in ``cfg.arena``. ``n_workers`` overrides the number of worker
    indices (a benchmark driving the engine without gunicorn)."""
    removed = Arena.sweep()
    if removed:
        log.info("removed %d stale arena(s): %s", len(removed), " ".join(removed))
    # --embedding: a channel's prompt area also carries the pooled vector back (engine/embed.py)
    n_area = max(cfg.n_ctx_slot, embedding_length(cfg.model) if cfg.embeddings else 0)
    geom = Geometry.sized(cfg.workers, cfg.http_threads, n_area, cfg.parallel, cfg.ring_cap)
    if n_workers:
        geom = dataclasses.replace(geom, n_workers=n_workers)
    arena = Arena.create(geom)
    cfg.arena = arena.instance
    g = arena.geom
    log.info("arena %s: %d worker indices x %d channels, slot context %d, %.1f MiB",
             arena.instance, g.n_workers, g.n_chan, g.max_prompt, g.bytes() / 2**20)
    return arena


class EngineProcess:
    """An engine child and the arena it serves. ``stop()`` ends both."""

    def __init__(self, cfg: Config, n_workers: int | None = None):
        self.arena = create_arena(prepare(cfg), n_workers)
        self.cfg = cfg
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 120.0) -> "EngineProcess":
        self.proc = subprocess.Popen([sys.executable, "-m", "engine", "--arena", self.arena.instance],
                                     cwd=ROOT, env=child_env(self.cfg))
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
