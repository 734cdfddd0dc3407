"""``ringserve``: llama-server's command line, one Config, one process tree.

Flags keep llama-server's names and defaults where they apply (common/arg.cpp).
llama-server flags that mean nothing here (``--jinja``, ``-cb``, ``--kv-unified``,
``--cache-ram N``, ``--slot-save-path P``, ``--log-*``, and any other unknown
``--flag [value]``) are accepted and logged once, so scripts written for
llama-server start ringserve unchanged.

Name clashes, resolved for llama-server scripts: ``-t/--threads`` is the
engine's CPU threads (llama-server's meaning); gunicorn's per-worker HTTP
threads are ``--threads-http`` (llama-server's flag for its HTTP pool);
``-c`` is the context size, so a gunicorn config file is ``--config``.
"""
from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from dataclasses import dataclass, field

from engine import crashdump
from engine.config import Config

log = logging.getLogger("ringserve")

# llama-server flags accepted and ignored: name -> number of values they take
IGNORED = {
    "--jinja": 0, "--no-jinja": 0, "-cb": 0, "--cont-batching": 0, "-nocb": 0, "--no-cont-batching": 0,
    "-kvu": 0, "--kv-unified": 0, "--no-kv-unified": 0, "--offline": 0, "-cram": 1, "--cache-ram": 1,
    "--sleep-idle-seconds": 1, "--slot-save-path": 1, "-v": 0, "--verbose": 0, "--log-disable": 0,
    "--log-file": 1, "--log-colors": 1, "--log-prefix": 0, "--log-timestamps": 0, "-lv": 1,
    "--log-verbosity": 1, "--props": 0, "-tb": 1, "--threads-batch": 1, "--mlock": 0, "--no-mmap": 0,
    "--context-shift": 0, "--no-context-shift": 0, "--keep": 1, "--cache-reuse": 1,
    "--sse-ping-interval": 1, "--no-warmup": 0, "--embedding": 0,
    "--embeddings": 0, "--reranking": 0, "--pooling": 1, "-dev": 1, "--device": 1, "-sm": 1,
    "--split-mode": 1, "-ts": 1, "--tensor-split": 1, "-mg": 1, "--main-gpu": 1, "--numa": 1,
    "-ctk": 1, "--cache-type-k": 1, "-ctv": 1, "--cache-type-v": 1, "--metrics-port": 1,
    "--cache-idle-slots": 0, "--no-cache-idle-slots": 0, "-ctxcp": 1, "--ctx-checkpoints": 1,
    "--swa-full": 0, "--reasoning-format": 1, "--reasoning-budget": 1,
}


@dataclass
class Options:
    """What the launcher needs besides the Config."""

    gunicorn_config: str = ""
    engine_cmd: list[str] = field(default_factory=list)  # hidden: tests run a fake engine
    ignored: list[str] = field(default_factory=list)


def _on_off(v: str) -> str:
    v = v.lower()
    if v in ("on", "off", "auto"):
        return v
    if v in ("1", "true", "enabled"):
        return "on"
    if v in ("0", "false", "disabled"):
        return "off"
    raise argparse.ArgumentTypeError("expected on, off or auto")


def _ngl(v: str) -> int:
    return {"auto": -1, "all": 999}.get(v, None) if v in ("auto", "all") else int(v)


def parser() -> argparse.ArgumentParser:
    d = Config()
    p = argparse.ArgumentParser(prog="ringserve", allow_abbrev=False,
                                description="llama-server compatible HTTP server (engine + gunicorn workers)")
    a = p.add_argument
    a("-m", "--model", default=d.model, help="GGUF path (default: the gemma-3-270m package model)")
    a("-a", "--alias", default=d.alias, help="model name(s) reported by the API, comma separated")
    a("-c", "--ctx-size", type=int, default=d.ctx_size, help="total KV context (0 = the model's)")
    a("-np", "--parallel", type=int, default=d.parallel, help="slots decoded together")
    a("-n", "--n-predict", "--predict", type=int, default=d.n_predict, dest="n_predict")
    a("-t", "--threads", type=int, default=d.threads, help="engine CPU threads (<= 0: all cores)")
    a("-b", "--batch-size", type=int, default=d.batch_size)
    a("-ub", "--ubatch-size", type=int, default=d.ubatch_size)
    a("-ngl", "--n-gpu-layers", "--gpu-layers", type=_ngl, default=d.n_gpu_layers, dest="n_gpu_layers")
    a("-bs", "--backend-sampling", action="store_true", default=d.backend_sampling,
      help="sample on the device: per-slot sampler chains in the decode graph (requests needing logits stay on the host)")
    a("-fa", "--flash-attn", type=_on_off, nargs="?", const="on", default=d.flash_attn)
    a("--host", default=d.host)
    a("--port", type=int, default=d.port)
    a("--api-key", default="", help="comma-separated keys")
    a("--api-key-file", default="", help="file with one key per line")
    a("--metrics", action="store_true", default=d.metrics)
    a("--slots", action=argparse.BooleanOptionalAction, default=d.slots)
    a("-to", "--timeout", type=int, default=d.timeout, help="gunicorn worker timeout, seconds")
    a("-s", "--seed", type=int, default=d.seed)
    a("--temp", type=float, default=d.temp)
    a("--top-k", type=int, default=d.top_k)
    a("--top-p", type=float, default=d.top_p)
    a("--min-p", type=float, default=d.min_p)
    a("--cache-prompt", action=argparse.BooleanOptionalAction, default=d.cache_prompt)
    a("-sps", "--slot-prompt-similarity", type=float, default=d.slot_prompt_similarity,
      help="reuse an idle slot's cache only if the common prefix exceeds this share of the prompt")
    a("--chat-template", default=d.chat_template, help="built-in name (chatml, gemma, llama3) or jinja source")
    a("--chat-template-file", default="")
    a("--webui", "--ui", dest="webui", action="store_true", default=d.webui, help="serve the chat page at / (default)")
    a("--no-webui", "--no-ui", dest="webui", action="store_false", help="do not serve the chat page")
    a("-w", "--workers", type=int, default=d.workers, help="gunicorn worker processes (default: max(2, min(cores // 2, 8)) = %(default)s here)")
    a("--threads-http", "--http-threads", type=int, default=d.http_threads, dest="http_threads",
      help="HTTP threads per worker (gunicorn --threads)")
    a("--config", default="", help="a gunicorn config file applied before ringserve's settings")
    a("--graceful-timeout", type=int, default=d.graceful_timeout,
      help="seconds a stopping instance (SIGTERM) or a replaced worker (SIGHUP) gets to finish its streams "
           "(default: the --config file's graceful_timeout, else 2)")
    a("--access-logfile", default=d.access_log, help="gunicorn access log ('-': stdout; default: none)")
    a("--access-logformat", default=d.access_log_format,
      help="gunicorn access_log_format (implies --access-logfile - when no access log is set)")
    a("--fail-queue-depth", type=int, default=d.queue_fail_depth,
      help="/health?fail_on_no_slot=1 answers 503 once no slot is idle and this many requests wait "
           "(0: as soon as no slot is idle, as llama-server)")
    a("--max-body", type=int, default=d.max_body, help="largest request body, bytes (413 past it)")
    a("--step-tokens", type=int, default=d.step_tokens,
      help="tokens per engine step: generating slots first, then prompt chunks in the rest (0: adaptive, "
           "about 3 pure decode steps, >= 512 prompt tokens while a long prompt waits; < 0: off, up to -b per step)")
    a("--step-mult", type=float, default=d.step_mult, help=argparse.SUPPRESS)
    a("--ring-cap", type=int, default=d.ring_cap, help=argparse.SUPPRESS)
    a("--engine-cmd", default=os.environ.get("RINGSERVE_ENGINE_CMD", ""), help=argparse.SUPPRESS)
    for flag, n in IGNORED.items():
        if n:
            a(flag, nargs=n, action="append", dest="_ignored", help=argparse.SUPPRESS)
        else:
            a(flag, action="append_const", const=flag, dest="_ignored", help=argparse.SUPPRESS)
    return p


def parse(argv: list[str]) -> tuple[Config, Options]:
    """argv -> (Config, Options). Unknown flags land in Options.ignored."""
    ns, rest = parser().parse_known_args(argv)
    keys = [k.strip() for k in ns.api_key.split(",") if k.strip()]
    if ns.api_key_file:
        with open(ns.api_key_file, encoding="utf-8") as f:
            keys += [ln.strip() for ln in f if ln.strip() and not ln.startswith("#")]
    tmpl = ns.chat_template
    if ns.chat_template_file:
        with open(ns.chat_template_file, encoding="utf-8") as f:
            tmpl = f.read()
    cfg = Config(
        model=ns.model, alias=ns.alias, ctx_size=ns.ctx_size, parallel=max(ns.parallel, 1), n_predict=ns.n_predict,
        threads=ns.threads, batch_size=ns.batch_size, ubatch_size=ns.ubatch_size, n_gpu_layers=ns.n_gpu_layers,
        backend_sampling=ns.backend_sampling,
        flash_attn=ns.flash_attn, seed=ns.seed, temp=ns.temp, top_k=ns.top_k, top_p=ns.top_p, min_p=ns.min_p,
        cache_prompt=ns.cache_prompt, slot_prompt_similarity=ns.slot_prompt_similarity, chat_template=tmpl, host=ns.host, port=ns.port, api_keys=keys,
        metrics=ns.metrics, slots=ns.slots, timeout=ns.timeout, workers=max(ns.workers, 1),
        http_threads=max(ns.http_threads, 1), max_body=ns.max_body, webui=ns.webui, ring_cap=ns.ring_cap,
        graceful_timeout=ns.graceful_timeout, access_log=ns.access_logfile, access_log_format=ns.access_logformat,
        queue_fail_depth=max(ns.fail_queue_depth, 0), step_tokens=ns.step_tokens, step_mult=max(ns.step_mult, 1.0),
    )
    ignored = [i for i, arg in enumerate(argv) if arg in IGNORED]
    names = [argv[i] for i in ignored] + rest
    return cfg, Options(gunicorn_config=ns.config, engine_cmd=shlex.split(ns.engine_cmd), ignored=names)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] [%(process)d] [%(levelname)s] %(message)s",
                        datefmt="%Y-%m-%d %H:%M:%S %z")
    crashdump.enable()
    cfg, opts = parse(sys.argv[1:] if argv is None else argv)
    if opts.ignored:
        log.info("ignoring llama-server options that do not apply: %s", " ".join(opts.ignored))
    from .launcher import Supervisor

    return Supervisor(cfg, opts).run()


if __name__ == "__main__":
    sys.exit(main())
