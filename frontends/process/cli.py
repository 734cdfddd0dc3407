"""``ringserve``: llama-server's command line, one Config, one process tree.

Flags keep llama-server's names and defaults where they apply (common/arg.cpp).
llama-server flags that mean nothing here (``--jinja``, ``-cb``, ``--kv-unified``,
``--log-*``, and any other unknown
``--flag [value]``) are accepted and logged once, so scripts written for
llama-server start ringserve unchanged.

Name clashes, resolved for llama-server scripts: ``-t/--threads`` is the
engine's CPU threads (llama-server's meaning); gunicorn's per-worker HTTP
threads are ``--threads-http`` (llama-server's flag for its HTTP pool);
``-c`` is the context size, so a gunicorn config file is ``--config``.

The flags themselves are declared with the settings, in engine/config.py.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import fields

from engine import crashdump
from engine.config import Config
from engine.kvevents import parse as kv_events_on

from .launcher import Supervisor

log = logging.getLogger("ringserve")

# llama-server flags accepted and ignored: name -> number of values they take
IGNORED = {
    "--jinja": 0, "--no-jinja": 0, "-cb": 0, "--cont-batching": 0, "-nocb": 0, "--no-cont-batching": 0,
    "-kvu": 0, "--kv-unified": 0, "--no-kv-unified": 0, "--offline": 0,
    "--sleep-idle-seconds": 1, "--log-disable": 0,
    "--log-file": 1, "--log-colors": 1, "--log-prefix": 0, "--log-timestamps": 0, "-lv": 1,
    "--log-verbosity": 1, "--props": 0, "-tb": 1, "--threads-batch": 1, "--mlock": 0, "--no-mmap": 0,
    "--keep": 1, "--cache-reuse": 1, "--sse-ping-interval": 1, "--no-warmup": 0,
    "-dev": 1, "--device": 1, "-sm": 1,
    "--split-mode": 1, "-ts": 1, "--tensor-split": 1, "-mg": 1, "--main-gpu": 1, "--numa": 1,
    "-ctk": 1, "--cache-type-k": 1, "-ctv": 1, "--cache-type-v": 1, "--metrics-port": 1,
    "--cache-idle-slots": 0, "--no-cache-idle-slots": 0, "-ctxcp": 1, "--ctx-checkpoints": 1,
    "--swa-full": 0,
}


def parser() -> argparse.ArgumentParser:
    """The command line: one option per flagged Config setting
    (engine/config.py), plus llama-server's flags that do not apply here."""
    p = argparse.ArgumentParser(prog="ringserve", allow_abbrev=False,
                                description="llama-server compatible HTTP server (engine + gunicorn workers)")
    for f in fields(Config):
        m = f.metadata
        if not m.get("flags"):
            continue
        kw = dict(m["arg"])
        if kw.get("action") == "store_bool":
            kw["action"] = argparse.BooleanOptionalAction
        if kw.get("type") not in (None, int, float, str):
            kw["type"] = _checked(kw["type"])
        # absent flags stay out of the namespace: parse() keeps the Config default
        help_ = argparse.SUPPRESS if m["help"] is None else m["help"]
        if m["help"] and "(default" not in m["help"]:
            help_ += f" (default: {getattr(Config(), f.name)!r})"
        if "action" not in kw:
            kw["metavar"] = m["flags"][-1].lstrip("-").upper().replace("-", "_")
        p.add_argument(*m["flags"], dest=f.name, default=argparse.SUPPRESS, help=help_, **kw)
        if m["file"]:
            p.add_argument(m["file"], dest=f"{f.name}__file", default="", metavar="FILE",
                           help=f"a file for {m['flags'][-1]}")
    for flag, n in IGNORED.items():
        if flag in p._option_string_actions:  # a setting took it over: no longer ignored
            continue
        if n:
            p.add_argument(flag, nargs=n, action="append", dest="_ignored", help=argparse.SUPPRESS)
        else:
            p.add_argument(flag, action="append_const", const=flag, dest="_ignored", help=argparse.SUPPRESS)
    return p


def _checked(fn):
    """A setting's converter as an argparse type (its ValueError/KeyError
    becomes argparse's usage error)."""
    def conv(v: str):
        try:
            return fn(v)
        except (KeyError, ValueError) as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    conv.__name__ = fn.__name__
    return conv


def parse(argv: list[str]) -> tuple[Config, list[str]]:
    """argv -> (Config, the llama-server flags ignored). A setting not given
    keeps its ``env`` variable's value, else its Config default; ``file``
    flags add (lists) or replace (strings); ``lo`` raises small values."""
    ns, rest = parser().parse_known_args(argv)
    given = vars(ns)
    cfg = Config()
    for f in fields(Config):
        m = f.metadata
        if m.get("env") and os.environ.get(m["env"]):
            setattr(cfg, f.name, os.environ[m["env"]])
        if f.name in given:
            setattr(cfg, f.name, given[f.name])
        if given.get(f"{f.name}__file"):
            with open(given[f"{f.name}__file"], encoding="utf-8") as fh:
                text = fh.read()
            if isinstance(getattr(cfg, f.name), list):
                getattr(cfg, f.name).extend(ln.strip() for ln in text.splitlines()
                                            if ln.strip() and not ln.startswith("#"))
            else:
                setattr(cfg, f.name, text)
        if m.get("lo") is not None:
            setattr(cfg, f.name, max(getattr(cfg, f.name), m["lo"]))
    if kv_events_on(cfg.kv_events_config) and (not cfg.prefix_cache or cfg.embeddings):
        # the events describe the prefix cache's index: without it they would never come
        parser().error("argument --kv-events-config: KV events need the prefix cache "
                       "(not with --no-prefix-cache, --embedding or --reranking)")
    ignored = [i for i, arg in enumerate(argv) if arg in IGNORED]
    return cfg, [argv[i] for i in ignored] + rest


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] [%(process)d] [%(levelname)s] %(message)s",
                        datefmt="%Y-%m-%d %H:%M:%S %z")
    crashdump.enable()
    cfg, ignored = parse(sys.argv[1:] if argv is None else argv)
    if ignored:
        log.info("ignoring llama-server options that do not apply: %s", " ".join(ignored))
    if cfg.context_shift:  # llama-server's own answer where its context cannot shift
        log.warning("context shift is not supported, it will be disabled: generation stops at the slot's context end")
    return Supervisor(cfg).run()


if __name__ == "__main__":
    sys.exit(main())
