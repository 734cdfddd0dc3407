"""``ringserve``: llama-server's command line, one Config, one process tree.

Flags keep llama-server's names and defaults where they apply (common/arg.cpp).
The command line is strict, as llama-server's: every llama-server flag that
is not a setting is either accepted because it changes nothing a user can
observe here (``--jinja``, ``-cb``, ``--log-*``, ...: logged once) or
refused at start (exit 2, "argument X: not supported by ringserve: why"),
and a flag nobody knows is argparse's usage error (exit 2), so a typo or a
``--lora`` never starts a server that does something else
(frontends/process/llamaflags.py holds that table).

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
import re
import sys
from dataclasses import fields

from engine import crashdump
from engine.config import Config
from engine.kvevents import parse as kv_events_on

from . import llamaenv, llamaflags
from .launcher import Supervisor
from .procs import leave

log = logging.getLogger("ringserve")
_FLOAT_KV = ("f32", "f16", "bf16")  # the -ctv types that do not need flash attention


class _Accepted(argparse.Action):
    """A llama-server flag with no observable effect here: kept (with its
    values) for the start-up log line."""

    def __init__(self, *a, why: str = "", **kw):
        self.why = why
        super().__init__(*a, **kw)

    def __call__(self, parser, ns, values, option_string=None):
        vals = [] if values is None else [values] if isinstance(values, str) else list(values)
        ns._accepted = [*getattr(ns, "_accepted", []), (option_string, vals, self.why)]


class _Refused(argparse.Action):
    """A llama-server flag ringserve cannot honour: the usage error, at once."""

    def __init__(self, *a, why: str = "", **kw):
        self.why = why
        super().__init__(*a, **kw)

    def __call__(self, parser, ns, values, option_string=None):
        raise argparse.ArgumentError(None, f"argument {option_string}: not supported by ringserve: {self.why}")


class _ListDevices(argparse.Action):
    """--list-devices: llama-server's list (ggml's non-CPU devices), then exit 0."""

    def __init__(self, *a, **kw):
        super().__init__(*a, nargs=0, **kw)

    def __call__(self, parser, ns, values, option_string=None):
        from engine import devices
        from engine.vocab import init_backend

        init_backend()
        print("Available devices:")
        for name, desc in devices.available():
            print(f"  {name}: {desc}")
        parser.exit()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        llama = version("llama_cpp_python")
    except PackageNotFoundError:
        llama = "?"
    return f"ringserve (llama-cpp-python {llama})"


def parser() -> argparse.ArgumentParser:
    """The command line: one option per flagged Config setting
    (engine/config.py), then every other llama-server flag, accepted or
    refused (llamaflags.py)."""
    p = argparse.ArgumentParser(
        prog="ringserve", allow_abbrev=False, usage="%(prog)s [options]",
        description="llama-server compatible HTTP server (engine + gunicorn workers)",
        epilog="Every other llama-server flag stops ringserve at start (exit 2) saying why it does not apply "
               "(frontends/process/llamaflags.py).")
    p.add_argument("--usage", action="help", help=argparse.SUPPRESS)
    p.add_argument("--version", action="version", version=_version())
    p.add_argument("--list-devices", action=_ListDevices, default=argparse.SUPPRESS,
                   help="print the devices -dev can name (ggml's non-CPU devices) and exit")
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
    group = p.add_argument_group("llama-server flags accepted with no effect here (logged at start)")
    for names, n, why, accepted in llamaflags.table():
        names = [x for x in names if x not in p._option_string_actions]  # a setting took it over
        if not names:
            continue
        kw = {"nargs": n, "metavar": ("A", "B") if n == 2 else "VALUE"} if n else {"nargs": 0}
        if accepted:
            group.add_argument(*names, action=_Accepted, why=why, dest="_accepted", default=argparse.SUPPRESS,
                               help=why, **kw)
        else:
            p.add_argument(*names, action=_Refused, why=why, dest="_refused", default=argparse.SUPPRESS,
                           help=argparse.SUPPRESS, **kw)
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


def _int(v: str) -> int:
    try:
        return int(v)
    except ValueError:
        return 0


def _normalize(p: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """argv as llama-server reads it (common/arg.cpp), for argparse: "--ctx_size"
    is "--ctx-size" (its "_" to "-" in "--" options), and the argument after
    an option that takes one value is that value even when it starts with "-"
    ("--api-key -Xyz", "--alias -name": argparse would take it for an
    option), passed as "--api-key=-Xyz". "-mx", an unknown single-dash
    flag, is refused here: argparse would read it as "-m x"."""
    acts, out, i = p._option_string_actions, [], 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--"):
            name, eq, val = a.partition("=")
            a = name.replace("_", "-") + eq + val
        act = acts.get(a)
        if act is None:
            if re.match(r"^-[A-Za-z]", a):
                p.error(f"unrecognized arguments: {a}")
            out.append(a)
            i += 1
            continue
        n = 1 if act.nargs is None else act.nargs if isinstance(act.nargs, int) else 0
        vals = argv[i + 1:i + 1 + n]
        out += [f"{a}={vals[0]}"] if n == 1 and vals and vals[0].startswith("-") else [a, *vals]
        i += 1 + len(vals)
    return out


def parse(argv: list[str]) -> tuple[Config, list[str]]:
    """argv -> (Config, the accepted llama-server flags that change nothing
    here, each with its values and why). A setting not given keeps its
    ``env`` variable's value, else its Config default; ``file`` flags add
    (lists) or replace (strings); ``lo`` raises small values. Exits 2
    (argparse's usage error) on an unknown or refused flag."""
    p = parser()
    try:
        env, notes = llamaenv.args_from_env(argv)
    except ValueError as e:
        p.error(str(e))
    for note in notes:
        log.info("from the environment: %s", note)
    given = vars(p.parse_args(_normalize(p, env + list(argv))))
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
    if cfg.parallel < 1:  # llama-server: 0 is an error, -1 "auto" (4 slots over a KV every slot shares)
        p.error("argument -np/--parallel: " + ("-1 (auto: 4 slots sharing one unified KV) is not implemented: "
                                               "give the number of slots" if cfg.parallel == -1 else
                                               f"invalid value {cfg.parallel}: at least 1 slot"))
    for flag, vals, _ in given.get("_accepted", []):  # llama-server's verbosity > 9 sets params.verbose
        if flag in ("-lv", "--verbosity", "--log-verbosity") and vals and _int(vals[0]) > 9:
            cfg.verbose = True
    if kv_events_on(cfg.kv_events_config) and (not cfg.prefix_cache or cfg.embeddings):
        # the events describe the prefix cache's index: without it they would never come
        p.error("argument --kv-events-config: KV events need the prefix cache "
                "(not with --no-prefix-cache, --embedding or --reranking)")
    if cfg.cache_host and (not cfg.prefix_cache or cfg.embeddings):
        # peers share the prefix cache's entries: without it there is nothing to offer or load
        p.error("argument --cache-host: the host tier shares the prefix cache's entries "
                "(not with --no-prefix-cache, --embedding or --reranking)")
    if cfg.cache_type_v not in _FLOAT_KV and cfg.flash_attn == "off":  # llama_init_from_model's refusal, early
        p.error(f"argument -ctv/--cache-type-v: quantized V cache ({cfg.cache_type_v}) requires flash_attn "
                "to be enabled (-fa on or auto)")
    if cfg.tools and "cors_origins" not in given:  # (LLAMA_ARG_CORS_ORIGINS is in ``given``: llamaenv)
        # common/arg.cpp: built-in tools (or MCP servers) make the CORS default localhost only
        log.warning("server tools are enabled, using localhost as default CORS origin (change via --cors-origins)")
        cfg.cors_origins = "localhost"
    return cfg, [" ".join([flag, *vals]) + f" ({why})" for flag, vals, why in given.get("_accepted", [])]


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] [%(process)d] [%(levelname)s] %(message)s",
                        datefmt="%Y-%m-%d %H:%M:%S %z")
    crashdump.enable()
    cfg, accepted = parse(sys.argv[1:] if argv is None else argv)
    if accepted:
        log.info("llama-server options with no effect here: %s", "; ".join(accepted))
    leave(Supervisor(cfg).run())  # everything it owned is released by now: no interpreter teardown

if __name__ == "__main__":
    sys.exit(main())
