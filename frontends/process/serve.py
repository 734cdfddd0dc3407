"""The gunicorn master the supervisor forks (frontends/process/master.py).

A gunicorn Application configured from the Config in RINGSERVE_CONFIG:
gthread workers (streams hold a thread; the master still gets heartbeats) of
our draining subclass (frontends/process/worker.py), ``max_requests`` 0 (a recycled
gthread worker cuts streams), the control socket disabled (one per instance
would collide), our worker-index hooks.

An optional gunicorn config file (``ringserve --config FILE``) is applied
first. What the arena is sized from or what ringserve relies on (bind,
workers, threads, worker class, timeout, max_requests) then comes from the
ringserve flags; what is only a matter of taste (graceful_timeout, accesslog,
access_log_format) comes from the ringserve flag when given, else from the
file, else from ringserve's default. The file's pre_fork/post_fork still run
after ours; its other hooks are gunicorn's business.
"""
from __future__ import annotations

from gunicorn.app.base import Application
from gunicorn.config import Config as GConfig

from engine import memory
from engine import memtrace
from engine.config import Config

from . import hooks
from .procs import GRACEFUL_DEFAULT

WORKER_CLASS = "frontends.process.worker.DrainWorker"


def _chain(ours, theirs):
    def hook(*args):
        ours(*args)
        theirs(*args)

    return hook


def binds(cfg: Config) -> list[str]:
    """gunicorn bind addresses of ``--host`` (comma separated, as
    llama-server's): an IPv4 address or name gets ``:port``, an IPv6
    address ``[addr]:port``, a path ending in ``.sock`` (llama-server's
    rule) or given as ``unix:PATH`` is a UNIX socket. gunicorn listens on
    every one; no address at all is a usage error, as in llama-server."""
    out = []
    for h in (h.strip() for h in cfg.host.split(",")):
        if not h:
            continue
        if h.startswith("unix:"):
            out.append(h)
        elif h.endswith(".sock"):
            out.append(f"unix:{h}")
        elif ":" in h and not h.startswith("["):
            out.append(f"[{h}]:{cfg.port}")
        else:
            out.append(f"{h}:{cfg.port}")
    if not out:
        raise ValueError("--host requires at least one address")
    return out


class Serve(Application):
    """Why Application and not BaseApplication: only Application can read a
    config file (load_config_from_file); our load_config replaces its
    command-line parsing, so gunicorn never looks at ringserve's argv."""

    def __init__(self, cfg: Config, vocab=None):
        self.rs_cfg, self.conf_file = cfg, cfg.gunicorn_config
        self.rs_load = vocab  # a procs.Attempt of the Vocab, run in the supervisor before it forked us
        self.rs_vocab = None
        super().__init__()

    def load_config(self) -> None:
        cfg = self.rs_cfg
        given: dict = {}
        if self.conf_file:
            given = self.load_config_from_file(self.conf_file)  # the file's names
        opts = {
            "bind": binds(cfg),
            "workers": cfg.workers,
            "threads": cfg.http_threads,
            "worker_class": WORKER_CLASS,
            "timeout": cfg.timeout,
            "max_requests": 0,
            "control_socket_disable": True,
            "proc_name": "ringserve",
            "daemon": False,  # the supervisor watches this process
        }
        if cfg.graceful_timeout >= 0 or "graceful_timeout" not in given:
            opts["graceful_timeout"] = cfg.graceful_timeout if cfg.graceful_timeout >= 0 else GRACEFUL_DEFAULT
        if cfg.access_log or "accesslog" not in given:
            opts["accesslog"] = cfg.access_log or ("-" if cfg.access_log_format else None)
        if cfg.access_log_format:
            opts["access_log_format"] = cfg.access_log_format
        for k, v in opts.items():
            self.cfg.set(k, v)
        for name in ("pre_fork", "post_fork"):
            theirs = self.cfg.settings[name].get()
            ours = getattr(hooks, name)
            default = self.cfg.settings[name].default
            self.cfg.set(name, ours if theirs is default or theirs is ours else _chain(ours, theirs))

    def run(self) -> None:
        """Serve with the vocabulary the supervisor loaded before it forked
        us: every worker inherits it copy-on-write. A worker that loaded its
        own would burn ~0.8 s of CPU at boot (Gemma's 262k tokens), and on a
        small box that burst, when gunicorn replaces a dead worker, stalls the
        engine's decode step (its threads wait for each other at every
        barrier) just when the engine should be freeing the dead worker's
        slots. The vocabulary is read-only after load, so sharing it across
        fork is safe; no process of the HTTP side starts a libllama thread
        pool (no context)."""
        memtrace.install("master")
        self.rs_vocab = self.rs_load.result()
        memory.settle(freeze=True)  # what workers inherit stays shared (engine/memory.py)
        super().run()

    def load(self):
        from frontends.api.app import build_from_env

        return build_from_env(self.rs_vocab)


LIBRARIES = ("falcon", "falcon.media", "orjson", "jinja2", "jinja2.sandbox", "prometheus_client")


def preload() -> None:
    """Import the app, its third-party libraries and our own modules before
    the master forks (the supervisor does, before it forks the master): the
    master and every worker then share them copy-on-write (falcon's compiled
    modules, jinja2 and prometheus_client: ~10 MiB a worker would otherwise
    hold alone, our modules a few more) and a worker boots without importing
    (~0.35 s each). What a worker still builds itself is its app object, from
    its own arena index (frontends/api/app.py ``build_from_env``). A SIGHUP
    replaces workers with the modules already loaded: new code needs a
    restart, as llama-server's does."""
    import importlib

    for name in LIBRARIES + ("frontends.api.app",):
        importlib.import_module(name)


def settings(cfg: Config) -> GConfig:
    """The gunicorn settings the master will run with (the supervisor needs
    graceful_timeout to know how long a drain may take). Reads the config
    file, so a broken file fails here, before anything is started."""
    return Serve(cfg).cfg
