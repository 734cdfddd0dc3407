"""Run ringserve under a plain gunicorn command, for those who deploy
gunicorn their own way::

    RINGSERVE_ARGS="-m model.gguf -c 8192 -np 4 --metrics" \\
        gunicorn -c frontends/gunicorn_conf.py frontends.app:app

RINGSERVE_ARGS takes the ``ringserve`` flags (see ``ringserve --help``).
Here gunicorn's own settings win for what gunicorn owns: ``-b/--bind``,
``-w/--workers`` and ``--threads`` on gunicorn's command line override the
defaults below (taken from RINGSERVE_ARGS' --host/--port/-w/--threads-http),
and the arena is sized from the values gunicorn ends up with. Keep
``worker_class`` (a gthread subclass that closes its listeners as soon as it
stops, see frontends/process/worker.py) and ``max_requests = 0``.

The master creates the arena and starts the engine in ``on_starting``
(restarting it whenever it dies, watched through a pidfd), and stops the
engine and unlinks the arena in ``on_exit``. SIGHUP reloads workers; the
arena has 2 x workers (+2) indices, so old and new workers overlap safely.
"""
import os
import shlex

from . import hooks, serve
from .cli import parse

_cfg, _ = parse(shlex.split(os.environ.get("RINGSERVE_ARGS", "")))  # once: on_starting gets this Config

bind = serve.binds(_cfg)
workers = _cfg.workers
threads = _cfg.http_threads
worker_class = serve.WORKER_CLASS
timeout = _cfg.timeout
graceful_timeout = _cfg.graceful_timeout if _cfg.graceful_timeout >= 0 else serve.GRACEFUL_DEFAULT
max_requests = 0
control_socket_disable = True
proc_name = "ringserve"



def on_starting(server) -> None:
    hooks.on_starting(server, _cfg)


on_exit = hooks.on_exit
pre_fork = hooks.pre_fork
post_fork = hooks.post_fork
