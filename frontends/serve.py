"""The gunicorn master the supervisor starts: ``python -m frontends.serve``.

A gunicorn BaseApplication configured from the Config in RINGSERVE_CONFIG:
gthread workers (streams hold a thread; the master still gets heartbeats),
``max_requests`` 0 (a recycled gthread worker cuts streams), the control
socket disabled (one per instance would collide), our worker-index hooks.
An optional gunicorn config file (``ringserve --config FILE``) is applied
first; the settings above then win, and its pre_fork/post_fork still run.
"""
from __future__ import annotations

import os

from gunicorn.app.base import BaseApplication

from engine.config import Config

from . import hooks


def _chain(ours, theirs):
    def hook(*args):
        ours(*args)
        theirs(*args)

    return hook


class Serve(BaseApplication):
    def __init__(self, cfg: Config, conf_file: str = ""):
        self.rs_cfg, self.conf_file = cfg, conf_file
        super().__init__()

    def load_config(self) -> None:
        cfg = self.rs_cfg
        if self.conf_file:
            self.load_config_from_file(self.conf_file)
        hosts = [h for h in cfg.host.split(",") if h]
        opts = {
            "bind": [h if h.startswith("unix:") else f"{h}:{cfg.port}" for h in hosts],
            "workers": cfg.workers,
            "threads": cfg.http_threads,
            "worker_class": "gthread",
            "timeout": cfg.timeout,
            "graceful_timeout": 2,
            "max_requests": 0,
            "control_socket_disable": True,
            "proc_name": "ringserve",
        }
        if not self.conf_file:
            opts["accesslog"] = None
        for k, v in opts.items():
            self.cfg.set(k, v)
        for name in ("pre_fork", "post_fork"):
            theirs = self.cfg.settings[name].get()
            ours = getattr(hooks, name)
            default = self.cfg.settings[name].default
            self.cfg.set(name, ours if theirs is default or theirs is ours else _chain(ours, theirs))

    def load(self):
        from .app import build_from_env

        return build_from_env()


def main() -> None:
    cfg = Config.from_json(os.environ["RINGSERVE_CONFIG"])
    Serve(cfg, os.environ.get("RINGSERVE_GUNICORN_CONF", "")).run()


if __name__ == "__main__":
    main()
