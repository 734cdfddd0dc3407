"""The engine's life, whichever way it started (``python -m engine`` or forked
from the launcher's weights: frontends/process/procs.py).

Lifecycle: attach the arena, start a new epoch (state loading), load the
model (or create a context over inherited weights), publish the model facts,
state ready, run the step loop until SIGTERM or until the launcher
disappears (getppid watchdog), then tell every reader we are going, state
down, return 0. A load failure sets state failed with the reason and returns
3 (the launcher does not restart a model that cannot load).
"""
from __future__ import annotations

import logging
import os
import signal
import time

from ipc.arena import Arena
from ipc.layout import ST_DOWN
from ipc.server import EnginePort

from . import crashdump
from . import memory
from . import memtrace
from .config import Config
from .kvevents import SetupError
from .sleep import Sleeper
from .vocab import ModelError

log = logging.getLogger("ringserve.engine")


def run(instance: str, weights=None) -> int:
    """Serve the arena ``instance`` until stopped. ``weights``: a callable
    returning the launcher's ``engine.weights.Weights`` (or raising what
    their load raised), where the engine was forked from them; None loads
    them here."""
    crashdump.enable()  # a native crash (load, decode) prints the Python stack into the log
    logging.basicConfig(level=logging.INFO, format="%(asctime)s engine %(levelname)s %(message)s")
    memtrace.install("engine")
    arena = Arena.attach(instance)
    cfg = Config.from_env()
    port = EnginePort(arena, on_reclaim=lambda w, chans: None)
    stopping = []

    def on_stop(*_) -> None:
        # the handler runs when sem_timedwait returns EINTR, and shm.wait retries on that until its
        # deadline (the idle heartbeat, 0.5 s): ring the doorbell so the retry returns at once
        stopping.append(1)
        arena.doorbell.release()

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    parent = os.getppid()
    try:
        from .model import Model

        t0 = time.perf_counter()
        model = Model(cfg, weights() if weights is not None else None)
    except Exception as e:  # noqa: BLE001 - any load failure is reported, not raised
        log.error("model load failed: %s", e)
        arena.fail(f"model load failed: {e}")
        arena.close()
        return 3
    for k in ("n_ctx", "n_ctx_slot", "n_vocab", "n_ctx_train", "kv_bytes"):
        arena.set(k, int(getattr(model, k)))
    arena.set("swa_full", int(bool(model.swa_full)))
    log.info("model loaded in %.1f s: n_ctx %d (%d per slot x %d), KV %.1f MiB (K %s, V %s), swa_full %s",
             time.perf_counter() - t0, model.n_ctx, model.n_ctx_slot, cfg.parallel,
             model.kv_bytes / 2**20, cfg.cache_type_k, cfg.cache_type_v, bool(model.swa_full))
    log.info("context: %.1f MiB of zero pages left to fault in as written (engine/memory.py)",
             model.zero_dropped / 2**20)
    log.info("llama params: %s", " ".join(f"{k}={v}" for k, v in model.params.items()))
    if cfg.embeddings:  # --embedding / --reranking: every request is a vector (engine/embed.py)
        from .embed import EmbedEngine as Engine
    else:
        from .loop import Engine
    try:
        eng = Engine(cfg, port, model)
    except (ModelError, SetupError) as e:  # e.g. --reranking on a model without a rank head; a KV events bind
        log.error("engine setup failed: %s", e)
        arena.fail(str(e))
        model.close()
        arena.close()
        return 3
    # the GGUF pages only load touched (repacked weights' sources) and what
    # the load freed go back before we serve (engine/memory.py)
    memory.drop_file_pages(cfg.model_path())
    memory.settle()
    memory.mmap_threshold(4 << 20)  # RAM-tier blobs: their own mappings, freed at once; not 1 MiB logits rows
    Sleeper.awake(arena)  # before READY: a worker that sees READY sees the engine awake
    port.ready()
    sleeper = Sleeper(cfg.sleep_idle_seconds, port)

    def stop() -> bool:
        return bool(stopping) or os.getppid() != parent

    try:
        while not stop():
            eng.step()
            if sleeper.due(eng):  # --sleep-idle-seconds: free everything, reload on the next ring
                sleeper.freeze(arena)
                eng.shutdown()
                model.close()
                eng = None
                if not sleeper.doze(arena, cfg.heartbeat_s, stop):
                    break
                model = Model(cfg)  # a reload failure exits with the error: the launcher restarts the engine
                eng = Engine(cfg, port, model)
                sleeper.woke(arena)
    finally:
        if eng is not None:
            eng.shutdown()
        arena.set("state", ST_DOWN)
        model.close()
        arena.close()
    return 0
