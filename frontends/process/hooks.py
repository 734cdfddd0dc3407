"""gunicorn hooks shared by both ways to run ringserve.

Worker indices: each live worker needs a distinct arena index. ``pre_fork``
(master, before fork) takes the lowest index no live worker holds; the new
worker is not yet in ``server.WORKERS`` then, and a dead one was popped
before ``child_exit``, so indices free themselves. The worker reads its index
from RINGSERVE_WORKER, set in ``post_fork`` (child side).

``on_starting``/``on_exit`` are used only by a plain gunicorn master
(gunicorn_conf.py): there the master creates the arena and runs the engine,
watched by a pidfd thread that restarts it.
"""
from __future__ import annotations

import logging
import os
import signal
import threading

log = logging.getLogger("ringserve")


def _logging(server) -> None:
    """Send our logger to gunicorn's error log (same format, same level)."""
    err = server.log.error_log
    log.handlers[:] = err.handlers
    log.setLevel(err.level)
    log.propagate = False


def pre_fork(server, worker) -> None:
    n = int(os.environ.get("RINGSERVE_N_WORKERS", "0"))
    used = {getattr(w, "rs_index", -1) for w in server.WORKERS.values()}
    worker.rs_index = next((i for i in range(n) if i not in used), -1)
    if worker.rs_index < 0:
        log.error("no free arena worker index (%d in use): the new worker will answer 503", len(used))


def post_fork(server, worker) -> None:
    """In the new worker, first: SIGTERM ends it until gunicorn installs its
    own handlers (``init_signals``).

    Why: a forked worker inherits the master's handler, which only queues
    the signal for the master's loop, a loop the worker never runs, so a
    SIGTERM that lands between the fork and ``init_signals`` is lost; the
    worker boots, and the master SIGKILLs it at graceful_timeout: a server
    stopped just after /health turned 200 (one worker up, the next just
    forked) took 2.1 s instead of 0.3 (seen in llama.cpp's own server
    tests). A worker this young holds no connection: nothing to drain."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    from engine import crashdump

    crashdump.enable()  # a native crash in a worker (tokenizer) prints its stack
    _logging(server)
    os.environ["RINGSERVE_WORKER"] = str(getattr(worker, "rs_index", -1))


# ---------------------------------------------------------------- plain gunicorn
def on_starting(server, cfg) -> None:
    """Create the arena and start the engine (once per master; a USR2
    re-exec'd master finds RINGSERVE_ARENA set and leaves the old one be).
    ``cfg``: RINGSERVE_ARGS as gunicorn_conf.py parsed them, once."""
    from engine.process import create_arena, prepare

    from .procs import EngineProc

    _logging(server)
    if os.environ.get("RINGSERVE_ARENA"):
        log.info("arena %s already set up by a parent master", os.environ["RINGSERVE_ARENA"])
        return
    cfg.workers, cfg.http_threads = server.cfg.workers, server.cfg.threads
    prepare(cfg)
    arena = create_arena(cfg)
    os.environ["RINGSERVE_ARENA"] = arena.instance
    os.environ["RINGSERVE_CONFIG"] = cfg.to_json()
    os.environ["RINGSERVE_N_WORKERS"] = str(arena.geom.n_workers)
    engine = EngineProc(arena, cfg)
    engine.start()
    stop = threading.Event()
    t = threading.Thread(target=_watch, args=(engine, stop), name="ringserve-engine", daemon=True)
    server.rs_engine, server.rs_stop, server.rs_thread = engine, stop, t
    t.start()


def _watch(engine, stop: threading.Event) -> None:
    """Restart the engine whenever its pidfd fires (it may already have been
    reaped by the arbiter; the pidfd does not care)."""
    import select
    import time

    while not stop.is_set():
        if engine.pidfd >= 0:
            r, _, _ = select.select([engine.pidfd], [], [], 0.5)
            if stop.is_set():
                return
            if r:
                why = engine.died()
                if engine.hopeless:
                    log.error("engine cannot load the model (%s): not restarting; workers answer 503", why)
                    return
                log.error("engine died (%s): restarting", why)
            else:
                engine.poll_ready()
        elif time.monotonic() >= engine.next_start:
            engine.start()
        else:
            time.sleep(0.1)


def on_exit(server) -> None:
    engine = getattr(server, "rs_engine", None)
    if engine is None:
        return
    server.rs_stop.set()
    server.rs_thread.join(2.0)
    engine.stop(timeout=3.0)
    engine.arena.close()
    engine.arena.unlink()
    log.info("arena %s unlinked", engine.arena.instance)
