"""llama-server's environment variables: ``LLAMA_ARG_*`` (and ``LLAMA_API_KEY``)
read as the flags they stand for.

Why: llama-server reads one variable per option (common/arg.cpp
``set_env``); a deployment that sets ``LLAMA_API_KEY`` or
``LLAMA_ARG_CTX_SIZE`` instead of a flag got a ringserve without its key or
with another context, silently. Here each set variable becomes its flag in
front of the command line, so it goes through the same checks as the flag
(a refused flag's variable refuses the start, exit 2) and the command line
wins where both name an option, as in llama-server (which parses the
environment first, then the arguments). Values as llama-server reads them:
an option without a value is on for ``on|enabled|true|1``; one with a
negative form (``--no-...``) takes true/false values, and
``LLAMA_ARG_NO_<NAME>`` set at all means false.

The table is llama-server's own (the vendored common/arg.cpp's options that
take an environment variable and that ringserve's parser knows; the rest
belong to other llama.cpp programs); tests/test_cli.py checks it against
those sources when they are there. Rows: variable, flags, negative flags,
kind (``value``: the variable is the flag's value; ``void``: a switch;
``bool``: a switch with a negative form).
"""
from __future__ import annotations

import os

ENV = [
    ("LLAMA_API_KEY", "--api-key", "", "value"),
    ("LLAMA_ARG_AGENT", "-ag --agent", "-no-ag --no-agent", "bool"),
    ("LLAMA_ARG_ALIAS", "-a --alias", "", "value"),
    ("LLAMA_ARG_API_KEY_FILE", "--api-key-file", "", "value"),
    ("LLAMA_ARG_API_PREFIX", "--api-prefix", "", "value"),
    ("LLAMA_ARG_BACKEND_SAMPLING", "-bs --backend-sampling", "", "void"),
    ("LLAMA_ARG_BATCH", "-b --batch-size", "", "value"),
    ("LLAMA_ARG_CACHE_IDLE_SLOTS", "--cache-idle-slots", "--no-cache-idle-slots", "bool"),
    ("LLAMA_ARG_CACHE_PROMPT", "--cache-prompt", "--no-cache-prompt", "bool"),
    ("LLAMA_ARG_CACHE_RAM", "-cram --cache-ram", "", "value"),
    ("LLAMA_ARG_CACHE_REUSE", "--cache-reuse", "", "value"),
    ("LLAMA_ARG_CACHE_TYPE_K", "-ctk --cache-type-k", "", "value"),
    ("LLAMA_ARG_CACHE_TYPE_V", "-ctv --cache-type-v", "", "value"),
    ("LLAMA_ARG_CHAT_TEMPLATE", "--chat-template", "", "value"),
    ("LLAMA_ARG_CHAT_TEMPLATE_FILE", "--chat-template-file", "", "value"),
    ("LLAMA_ARG_CHAT_TEMPLATE_KWARGS", "--chat-template-kwargs", "", "value"),
    ("LLAMA_ARG_CHECKPOINT_MIN_SPACING_NT", "-cms --checkpoint-min-step", "", "value"),
    ("LLAMA_ARG_CONTEXT_SHIFT", "--context-shift", "--no-context-shift", "bool"),
    ("LLAMA_ARG_CONT_BATCHING", "-cb --cont-batching", "-nocb --no-cont-batching", "bool"),
    ("LLAMA_ARG_CORS_CREDENTIALS", "--cors-credentials", "--no-cors-credentials", "bool"),
    ("LLAMA_ARG_CORS_HEADERS", "--cors-headers", "", "value"),
    ("LLAMA_ARG_CORS_METHODS", "--cors-methods", "", "value"),
    ("LLAMA_ARG_CORS_ORIGINS", "--cors-origins", "", "value"),
    ("LLAMA_ARG_CPU_MOE", "-cmoe --cpu-moe", "", "void"),
    ("LLAMA_ARG_CTX_CHECKPOINTS", "-ctxcp --ctx-checkpoints --swa-checkpoints", "", "value"),
    ("LLAMA_ARG_CTX_SIZE", "-c --ctx-size", "", "value"),
    ("LLAMA_ARG_DEFRAG_THOLD", "-dt --defrag-thold", "", "value"),
    ("LLAMA_ARG_DEVICE", "-dev --device", "", "value"),
    ("LLAMA_ARG_DOCKER_REPO", "-dr --docker-repo", "", "value"),
    ("LLAMA_ARG_DRAFT_MAX", "--draft --draft-n --draft-max", "", "value"),
    ("LLAMA_ARG_DRAFT_MIN", "--draft-min --draft-n-min", "", "value"),
    ("LLAMA_ARG_EMBEDDINGS", "--embedding --embeddings", "", "void"),
    ("LLAMA_ARG_ENDPOINT_METRICS", "--metrics", "", "void"),
    ("LLAMA_ARG_ENDPOINT_PROPS", "--props", "", "void"),
    ("LLAMA_ARG_ENDPOINT_SLOTS", "--slots", "--no-slots", "bool"),
    ("LLAMA_ARG_FIT", "-fit --fit", "", "value"),
    ("LLAMA_ARG_FIT_CTX", "-fitc --fit-ctx", "", "value"),
    ("LLAMA_ARG_FIT_TARGET", "-fitt --fit-target", "", "value"),
    ("LLAMA_ARG_FLASH_ATTN", "-fa --flash-attn", "", "value"),
    ("LLAMA_ARG_FREQUENCY_PENALTY", "--frequency-penalty", "", "value"),
    ("LLAMA_ARG_HF_FILE", "-hff --hf-file", "", "value"),
    ("LLAMA_ARG_HF_REPO", "-hf -hfr --hf-repo", "", "value"),
    ("LLAMA_ARG_HOST", "--host", "", "value"),
    ("LLAMA_ARG_IMAGE_MAX_TOKENS", "--image-max-tokens", "", "value"),
    ("LLAMA_ARG_IMAGE_MIN_TOKENS", "--image-min-tokens", "", "value"),
    ("LLAMA_ARG_JINJA", "--jinja", "--no-jinja", "bool"),
    ("LLAMA_ARG_KV_OFFLOAD", "-kvo --kv-offload", "-nkvo --no-kv-offload", "bool"),
    ("LLAMA_ARG_KV_UNIFIED", "-kvu --kv-unified", "-no-kvu --no-kv-unified", "bool"),
    ("LLAMA_ARG_KV_UNIFIED_PER_SLOT", "--kv-unified-per-slot", "", "value"),
    ("LLAMA_ARG_LAZY_MODE", "-lzm --lazy-mode", "", "value"),
    ("LLAMA_ARG_LOAD_MODE", "-lm --load-mode", "", "value"),
    ("LLAMA_ARG_LOG_COLORS", "--log-colors", "", "value"),
    ("LLAMA_ARG_LOG_FILE", "--log-file", "", "value"),
    ("LLAMA_ARG_LOG_JSONL", "--log-jsonl", "--no-log-jsonl", "value"),
    ("LLAMA_ARG_LOG_PREFIX", "--log-prefix", "--no-log-prefix", "value"),
    ("LLAMA_ARG_LOG_TIMESTAMPS", "--log-timestamps", "--no-log-timestamps", "value"),
    ("LLAMA_ARG_LOG_VERBOSITY", "-lv --verbosity --log-verbosity", "", "value"),
    ("LLAMA_ARG_MAIN_GPU", "-mg --main-gpu", "", "value"),
    ("LLAMA_ARG_MCP_SERVERS_CONFIG", "--mcp-servers-config", "", "value"),
    ("LLAMA_ARG_MCP_SERVERS_JSON", "--mcp-servers-json", "", "value"),
    ("LLAMA_ARG_MIN_P", "--min-p", "", "value"),
    ("LLAMA_ARG_MMPROJ", "-mm --mmproj", "", "value"),
    ("LLAMA_ARG_MMPROJ_AUTO", "--mmproj-auto", "--no-mmproj --no-mmproj-auto", "bool"),
    ("LLAMA_ARG_MMPROJ_OFFLOAD", "--mmproj-offload", "--no-mmproj-offload", "bool"),
    ("LLAMA_ARG_MMPROJ_URL", "-mmu --mmproj-url", "", "value"),
    ("LLAMA_ARG_MODEL", "-m --model", "", "value"),
    ("LLAMA_ARG_MODELS_AUTOLOAD", "--models-autoload", "--no-models-autoload", "bool"),
    ("LLAMA_ARG_MODELS_DIR", "--models-dir", "", "value"),
    ("LLAMA_ARG_MODELS_MAX", "--models-max", "", "value"),
    ("LLAMA_ARG_MODELS_PRESET", "--models-preset", "", "value"),
    ("LLAMA_ARG_MODEL_URL", "-mu --model-url", "", "value"),
    ("LLAMA_ARG_MTMD_BATCH_MAX_TOKENS", "--mtmd-batch-max-tokens", "", "value"),
    ("LLAMA_ARG_NO_HOST", "--no-host", "", "void"),
    ("LLAMA_ARG_NUMA", "--numa", "", "value"),
    ("LLAMA_ARG_N_CPU_FFN", "-ncffn --n-cpu-ffn", "", "value"),
    ("LLAMA_ARG_N_CPU_MOE", "-ncmoe --n-cpu-moe", "", "value"),
    ("LLAMA_ARG_N_GPU_LAYERS", "-ngl --gpu-layers --n-gpu-layers", "", "value"),
    ("LLAMA_ARG_N_GPU_LAYERS_DRAFT", "--spec-draft-ngl -ngld --gpu-layers-draft --n-gpu-layers-draft", "", "value"),
    ("LLAMA_ARG_N_PARALLEL", "-np --parallel", "", "value"),
    ("LLAMA_ARG_N_PREDICT", "-n --predict --n-predict", "", "value"),
    ("LLAMA_ARG_OFFLINE", "--offline", "", "void"),
    ("LLAMA_ARG_OVERRIDE_TENSOR", "-ot --override-tensor", "", "value"),
    ("LLAMA_ARG_PERF", "--perf", "--no-perf", "bool"),
    ("LLAMA_ARG_POOLING", "--pooling", "", "value"),
    ("LLAMA_ARG_PORT", "--port", "", "value"),
    ("LLAMA_ARG_PREFILL_ASSISTANT", "--prefill-assistant", "--no-prefill-assistant", "bool"),
    ("LLAMA_ARG_PRESENCE_PENALTY", "--presence-penalty", "", "value"),
    ("LLAMA_ARG_REASONING", "-rea --reasoning", "", "value"),
    ("LLAMA_ARG_REASONING_EFFORT", "--reasoning-effort", "", "value"),
    ("LLAMA_ARG_REASONING_PRESERVE", "--reasoning-preserve", "--no-reasoning-preserve", "bool"),
    ("LLAMA_ARG_REPACK", "--repack", "-nr --no-repack", "bool"),
    ("LLAMA_ARG_REPEAT_PENALTY", "--repeat-penalty", "", "value"),
    ("LLAMA_ARG_RERANKING", "--rerank --reranking", "", "void"),
    ("LLAMA_ARG_REUSE_PORT", "--reuse-port", "", "void"),
    ("LLAMA_ARG_ROPE_FREQ_BASE", "--rope-freq-base", "", "value"),
    ("LLAMA_ARG_ROPE_FREQ_SCALE", "--rope-freq-scale", "", "value"),
    ("LLAMA_ARG_ROPE_SCALE", "--rope-scale", "", "value"),
    ("LLAMA_ARG_ROPE_SCALING_TYPE", "--rope-scaling", "", "value"),
    ("LLAMA_ARG_RPC", "--rpc", "", "value"),
    ("LLAMA_ARG_SKIP_CHAT_PARSING", "--skip-chat-parsing", "--no-skip-chat-parsing", "bool"),
    ("LLAMA_ARG_SPEC_DRAFT_BACKEND_SAMPLING", "--spec-draft-backend-sampling", "--no-spec-draft-backend-sampling", "bool"),
    ("LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K", "--spec-draft-type-k -ctkd --cache-type-k-draft", "", "value"),
    ("LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_V", "--spec-draft-type-v -ctvd --cache-type-v-draft", "", "value"),
    ("LLAMA_ARG_SPEC_DRAFT_CPU_MOE", "--spec-draft-cpu-moe -cmoed --cpu-moe-draft", "", "void"),
    ("LLAMA_ARG_SPEC_DRAFT_HF_REPO", "--spec-draft-hf -hfd -hfrd --hf-repo-draft", "", "value"),
    ("LLAMA_ARG_SPEC_DRAFT_MODEL", "--spec-draft-model -md --model-draft", "", "value"),
    ("LLAMA_ARG_SPEC_DRAFT_N_CPU_MOE", "--spec-draft-n-cpu-moe --spec-draft-ncmoe -ncmoed --n-cpu-moe-draft", "", "value"),
    ("LLAMA_ARG_SPEC_DRAFT_N_MAX", "--spec-draft-n-max", "", "value"),
    ("LLAMA_ARG_SPEC_DRAFT_N_MIN", "--spec-draft-n-min", "", "value"),
    ("LLAMA_ARG_SPEC_DRAFT_P_MIN", "--spec-draft-p-min --draft-p-min", "", "value"),
    ("LLAMA_ARG_SPEC_DRAFT_P_SPLIT", "--spec-draft-p-split --draft-p-split", "", "value"),
    ("LLAMA_ARG_SPEC_SYNTH_LEN", "--spec-synth-len", "", "value"),
    ("LLAMA_ARG_SPEC_SYNTH_RATES", "--spec-synth-rates", "", "value"),
    ("LLAMA_ARG_SPEC_TYPE", "--spec-type", "", "value"),
    ("LLAMA_ARG_SPLIT_MODE", "-sm --split-mode", "", "value"),
    ("LLAMA_ARG_SSE_PING_INTERVAL", "--sse-ping-interval", "", "value"),
    ("LLAMA_ARG_SSL_CERT_FILE", "--ssl-cert-file", "", "value"),
    ("LLAMA_ARG_SSL_KEY_FILE", "--ssl-key-file", "", "value"),
    ("LLAMA_ARG_STATIC_PATH", "--path", "", "value"),
    ("LLAMA_ARG_SWA_FULL", "--swa-full", "", "void"),
    ("LLAMA_ARG_TAGS", "--tags", "", "value"),
    ("LLAMA_ARG_TEMPERATURE", "--temp --temperature", "", "value"),
    ("LLAMA_ARG_TENSOR_SPLIT", "-ts --tensor-split", "", "value"),
    ("LLAMA_ARG_THINK", "--reasoning-format", "", "value"),
    ("LLAMA_ARG_THINK_BUDGET", "--reasoning-budget", "", "value"),
    ("LLAMA_ARG_THINK_BUDGET_MESSAGE", "--reasoning-budget-message", "", "value"),
    ("LLAMA_ARG_THREADS", "-t --threads", "", "value"),
    ("LLAMA_ARG_THREADS_HTTP", "--threads-http", "", "value"),
    ("LLAMA_ARG_TIMEOUT", "-to --timeout", "", "value"),
    ("LLAMA_ARG_TOOLS", "--tools", "", "value"),
    ("LLAMA_ARG_TOOLS_RUNTIME", "--tools-runtime", "", "value"),
    ("LLAMA_ARG_TOP_K", "--top-k", "", "value"),
    ("LLAMA_ARG_TOP_P", "--top-p", "", "value"),
    ("LLAMA_ARG_UBATCH", "-ub --ubatch-size", "", "value"),
    ("LLAMA_ARG_UI", "--ui --webui", "--no-ui --no-webui", "bool"),
    ("LLAMA_ARG_UI_CONFIG", "--ui-config --webui-config", "", "value"),
    ("LLAMA_ARG_UI_CONFIG_FILE", "--ui-config-file --webui-config-file", "", "value"),
    ("LLAMA_ARG_UI_MCP_PROXY", "--ui-mcp-proxy --webui-mcp-proxy", "--no-ui-mcp-proxy --no-webui-mcp-proxy", "bool"),
    ("LLAMA_ARG_VIDEO_FFMPEG_DIR", "--video-ffmpeg-dir", "", "value"),
    ("LLAMA_ARG_VIDEO_FPS", "--video-fps", "", "value"),
    ("LLAMA_ARG_VIDEO_TIMESTAMP_INTERVAL", "--video-timestamp-interval", "", "value"),
    ("LLAMA_ARG_YARN_ATTN_FACTOR", "--yarn-attn-factor", "", "value"),
    ("LLAMA_ARG_YARN_BETA_FAST", "--yarn-beta-fast", "", "value"),
    ("LLAMA_ARG_YARN_BETA_SLOW", "--yarn-beta-slow", "", "value"),
    ("LLAMA_ARG_YARN_EXT_FACTOR", "--yarn-ext-factor", "", "value"),
    ("LLAMA_ARG_YARN_ORIG_CTX", "--yarn-orig-ctx", "", "value"),
    ("MTMD_BACKEND_DEVICE", "-mmdev --mmproj-device", "", "value"),
]

# Not read: HF_TOKEN (llama-server's --hf-token), a download credential many hosts set for other programs;
# ringserve downloads nothing, and a token changes no answer (the flag itself is refused: it asks for a download).

TRUE, FALSE = ("on", "enabled", "true", "1"), ("off", "disabled", "false", "0")


def _given(flags: list[str], argv: list[str]) -> bool:
    return any(a == f or a.startswith(f + "=") for a in argv for f in flags)


def args_from_env(argv: list[str], environ=os.environ) -> tuple[list[str], list[str]]:
    """(the flags the environment stands for, ``VAR=value -> flags`` notes for
    the log). A variable whose option the command line also names is left
    out (the command line wins). ValueError: a switch's value is neither
    true nor false (llama-server's error too)."""
    out: list[str] = []
    notes: list[str] = []
    for env, flags, neg, kind in ENV:
        pos, negs = flags.split(), neg.split()
        no = env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_") if negs else ""
        if no and no in environ:
            value = "0"
        elif env in environ:
            value = environ[env]
        else:
            continue
        if _given(pos + negs, argv):
            continue
        if kind == "value":
            got = [pos[-1], value]
        elif value.lower() in TRUE:
            got = [pos[-1]]
        elif kind == "bool" and value.lower() in FALSE:
            got = [negs[-1]]
        elif kind == "void" and value.lower() in FALSE:
            got = []
        else:
            raise ValueError(f"environment variable {env}: {value!r} is neither true nor false")
        out += got
        notes.append(f"{env}={'...' if 'KEY' in env else value} -> "
                     f"{' '.join(got[:1]) or '(off)'}")
    return out, notes
