"""The ``ringserve`` process: a supervisor over the engine and gunicorn.

Process tree::

    ringserve (this supervisor: owns the arena, never serves HTTP)
    |- engine        forked from the weights we loaded, or python -m engine --arena INSTANCE   (restarted if it dies)
    `- gunicorn master, forked from us (frontends/process/master.py), gthread workers forked from it

Where the build offloads nothing (engine/weights.py ``forkable``), we load
the weights and fork the engine from them, so the engine and the whole HTTP
side share one vocabulary and one set of model buffers; a restarted engine
is forked from the same weights (no reload). Elsewhere (a GPU build: a
device runtime does not survive fork) the engine is exec'd and the HTTP side
loads the vocabulary alone.

Why not make gunicorn's master the parent of the engine: its arbiter reaps
every child with waitpid(-1) and treats unknown children as workers, so the
engine's death would be swallowed or misreported. Here each child is watched
with a pidfd and reaped by us.

Invariants: the supervisor is the only process that creates and unlinks the
arena; SIGTERM/SIGINT drain, then end with exit 0 and nothing left in
/dev/shm: the arena is marked draining (/health answers 503), gunicorn gets
SIGTERM (its workers close their listeners, so balancers go elsewhere, and
finish in-flight streams within graceful_timeout), and only once gunicorn is
gone is the engine stopped; all within graceful_timeout + 3 s (5 s with the
default 2 s). Children run in their own sessions (a terminal's Ctrl-C reaches
only us, we stop them in order) and get SIGTERM if we die (PDEATHSIG).

To run under your own gunicorn command instead, see frontends/gunicorn_conf.py.
The engine command can be replaced (tests run frontends/testing/fake_engine.py) with the
hidden ``--engine-cmd`` option or the RINGSERVE_ENGINE_CMD variable.
"""
from __future__ import annotations

import logging
import os
import select
import signal
import time

from engine import memory
from engine import memtrace
from engine.config import Config
from engine.process import create_arena, prepare
from engine.weights import Weights, forkable
from frontends.text.tokenizer import Vocab

from . import serve
from .master import Master
from .procs import GRACEFUL_DEFAULT, Attempt, EngineProc, child_env

log = logging.getLogger("ringserve")

FORWARD = (signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU)
STOP = (signal.SIGTERM, signal.SIGINT)
GUNICORN_MARGIN = 2.0  # seconds past graceful_timeout before gunicorn's group gets SIGKILL
ENGINE_STOP = 1.0  # seconds the engine gets after SIGTERM (it only ends what the drain left)


def graceful_timeout(cfg: Config) -> float:
    """The drain time gunicorn's master will run with: only a gunicorn config
    file (read here, so that a broken one fails before anything starts) can
    change ringserve's own answer."""
    if cfg.gunicorn_config:
        return float(serve.settings(cfg).graceful_timeout)
    return float(cfg.graceful_timeout if cfg.graceful_timeout >= 0 else GRACEFUL_DEFAULT)


class Supervisor:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.arena = None
        self.engine: EngineProc | None = None
        self.gun: Master | None = None
        self.gun_fd = -1
        self.code = 0
        self.graceful = 0.0

    # ------------------------------------------------------------- lifecycle
    def run(self) -> int:
        # reads --config: a broken file stops us before anything starts
        self.graceful = graceful_timeout(self.cfg)
        memtrace.install("launcher")
        rfd, wfd = os.pipe()
        os.set_blocking(rfd, False)
        os.set_blocking(wfd, False)
        old = signal.set_wakeup_fd(wfd)
        for s in STOP + FORWARD + (signal.SIGCHLD,):
            signal.signal(s, lambda *_: None)  # the wakeup fd carries the number
        try:
            cfg = prepare(self.cfg)
            # engine/weights.py: loaded here, shared by fork. Before the arena exists: a native crash in the
            # load (engine/crashdump.py prints the stack) ends us with its signal and nothing left behind
            weights = Attempt(Weights, cfg) if forkable(cfg) else None
            self.arena = create_arena(cfg)
            self.engine = EngineProc(self.arena, cfg, weights and weights.result, lambda: [rfd, wfd, self.gun_fd])
            self.engine.start()
            if weights is not None:  # our PTEs of the GGUF: the engine faults in what it reads (engine/memory.py)
                memory.drop_file_pages(cfg.model_path())
            serve.preload()  # gunicorn, falcon and the app: the master and its workers inherit them
            core = weights.value.vocab if weights is not None and weights.value is not None else None
            vocab = Attempt(Vocab, cfg.model_path(), core)
            # Freeze before the fork: a later collection here would write the header of every object
            # the master shares with us, copying those pages; the collection below sees new ones only.
            memory.settle(freeze=True)
            self._start_gunicorn(vocab, [rfd, wfd, self.engine.pidfd])
            memory.settle()  # set up: the rest of our life is a select loop
            self._loop(rfd)
        except Exception:
            log.exception("supervisor failed")
            self.code = 1
        finally:
            self._shutdown()
            signal.set_wakeup_fd(old)
            os.close(rfd)
            os.close(wfd)
        return self.code

    def _start_gunicorn(self, vocab: Attempt, close: list[int]) -> None:
        extra = {"RINGSERVE_N_WORKERS": str(self.arena.geom.n_workers)}
        self.gun = Master()
        self.gun.start(child_env(self.cfg, extra), vocab, close)
        self.gun_fd = self.gun.pidfd
        log.info("gunicorn master started: pid %d, http://%s:%d", self.gun.pid, self.cfg.host, self.cfg.port)

    def _loop(self, rfd: int) -> None:
        eng = self.engine
        while True:
            fds = [rfd, self.gun_fd] + ([eng.pidfd] if eng.pidfd >= 0 else [])
            r, _, _ = select.select(fds, [], [], 0.5)
            if rfd in r:
                for sig in os.read(rfd, 64):
                    if sig in STOP:
                        log.info("received %s: stopping", signal.Signals(sig).name)
                        return
                    if sig in FORWARD:
                        log.info("forwarding %s to gunicorn", signal.Signals(sig).name)
                        os.kill(self.gun.pid, sig)
            if self.gun_fd in r:
                code = self.gun.wait()
                os.close(self.gun_fd)
                self.gun_fd = -1
                log.error("gunicorn master exited with %s: stopping", code)
                self.code = code or 1
                return
            if eng.pidfd >= 0 and eng.pidfd in r:
                why = eng.died()  # before was_ready is read: it takes what the arena said at the death
                first = eng.starts == 1 and not eng.was_ready
                if first or eng.hopeless:  # like llama-server failing to load the model: give up
                    log.error("engine failed before it was ever ready (%s): stopping", why)
                    self.code = 1
                    return
                log.error("engine died (%s): restarting in %.1f s", why, eng.next_start - time.monotonic())
            if eng.pidfd < 0 and time.monotonic() >= eng.next_start:
                eng.start()
            if eng.pidfd >= 0:
                eng.poll_ready()

    def _shutdown(self) -> None:
        """Drain gunicorn (the engine keeps serving its streams), then stop
        the engine, then unlink."""
        if self.gun is not None and self.gun_fd >= 0:
            if self.arena is not None:
                self.arena.set("draining", 1)
            try:
                os.kill(self.gun.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            r, _, _ = select.select([self.gun_fd], [], [], self.graceful + GUNICORN_MARGIN)
            if not r:
                log.warning("gunicorn did not stop in time: SIGKILL to its process group")
                try:
                    os.killpg(self.gun.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.gun.wait()
            os.close(self.gun_fd)
            self.gun_fd = -1
        if self.gun is not None:
            try:  # workers orphaned by a killed master
                os.killpg(self.gun.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self.engine is not None:
            self.engine.stop(timeout=ENGINE_STOP)
        if self.arena is not None:
            self.arena.close()
            n = self.arena.unlink()
            log.info("arena %s unlinked (%d objects)", self.arena.instance, n)
            self.arena = None
