"""Every llama-server flag that is not a ringserve setting: accepted (it
changes nothing a user can observe here) or refused (exit 2, saying why).

The list is llama-server's own (``llama-server --help`` of the vendored
build, the options of common/arg.cpp that LLAMA_EXAMPLE_SERVER takes;
tests/test_cli.py checks it against that binary when it is there). Every
name is registered with argparse, so a short option never swallows a longer
llama-server flag (``-md x.gguf`` is not ``-m d``), and a flag in neither
this table nor the settings is argparse's "unrecognized arguments" (exit 2).

A setting (engine/config.py) that takes a name over wins: its name is
skipped here (cli.parser), so implementing a flag is one ``setting(...)``
and nothing to delete. Rows: option strings (space separated), the values
they take (0, 1, 2 or "?": optional), why.
"""
from __future__ import annotations

# flags that change nothing observable here: accepted, logged once at start
ACCEPTED = [
    ("-cb --cont-batching -nocb --no-cont-batching", 0, "batching is always continuous"),
    ("-no-kvu --no-kv-unified", 0, "one KV stream per slot; the prefix cache shares prefixes across slots"),
    ("--swa-full", 0, "the sliding-window cache is always full-size (exact prefix reuse)"),
    ("--cache-idle-slots --no-cache-idle-slots", 0, "the prefix cache keeps idle slots' KV"),
    ("-ctxcp --ctx-checkpoints --swa-checkpoints", 1, "the prefix cache places its own checkpoints"),
    ("-cms --checkpoint-min-step", 1, "the prefix cache places its own checkpoints"),
    ("--warmup --no-warmup", 0, "the engine's start-up is its own"),
    ("--offline", 0, "nothing is downloaded"),
    ("--no-mmproj --no-mmproj-auto --mmproj-auto", 0, "no multimodal projector is loaded (text only)"),
    ("--mmproj-offload --no-mmproj-offload", 0, "no multimodal projector is loaded (text only)"),
    ("-e --escape --no-escape", 0, "escapes apply to -p/-r prompts, which a server does not read"),
    ("-dt --defrag-thold", 1, "deprecated; llama.cpp ignores it"),
    ("--perf --no-perf", 0, "libllama's internal timings (logging)"),
    ("--log-disable", 0, "logging"), ("--log-file", 1, "logging (ringserve logs to stderr)"),
    ("--log-jsonl --no-log-jsonl", 0, "logging"), ("--log-colors", "?", "logging"),
    ("--log-prefix --no-log-prefix", 0, "logging"), ("--log-timestamps --no-log-timestamps", 0, "logging"),
    ("-lv --verbosity --log-verbosity", 1, "logging; above 9 it is -v (cli.parse), as llama-server's"), ("--log-prompts-dir", 1, "logging"),
    # until the settings that implement them land (issue 26: i26b, issue 25: reasoning)
    ("--keep", 1, "only with --context-shift, which ringserve does not do"),
    ("--cache-reuse", 1, "KV shifting is not done: a prompt reuses its cached prefix only (speed, not results)"),
    ("--sleep-idle-seconds", 1, "the model stays loaded"),
    ("--reasoning-format", 1, "reasoning output is left in content (the model's text, unparsed)"),
    ("--reasoning-budget", 1, "the thinking budget is not enforced (-1, unrestricted)"),
]

_SPEC = "speculative decoding is not implemented"
_DL = "ringserve serves a local GGUF (-m): it downloads nothing"
_MM = "multimodal input is not implemented (text only)"
_CPU = "thread placement is not implemented (use taskset, numactl or nice on the ringserve process)"
_DEF = "a server-wide logit bias or grammar is not implemented (send the parameter per request)"
_ROPE = "RoPE/YaRN overrides are not implemented (the model's own are used)"
_MEM = "not implemented (llama.cpp's default is used)"

# flags that would change what a user gets, which ringserve cannot do: exit 2 at start
REFUSED = [
    ("-kvu --kv-unified", 0, "a KV shared by every slot (a slot may fill the whole context) is not implemented: "
                             "give -c as slots x the longest prompt"),
    ("-cl --cache-list", 0, _DL), ("--completion-bash", 0, "not implemented"),
    ("-C --cpu-mask", 1, _CPU), ("-Cr --cpu-range", 1, _CPU), ("--cpu-strict", 1, _CPU), ("--prio", 1, _CPU),
    ("--poll", 1, _CPU), ("-Cb --cpu-mask-batch", 1, _CPU), ("-Crb --cpu-range-batch", 1, _CPU),
    ("--cpu-strict-batch", 1, _CPU), ("--prio-batch", 1, _CPU), ("--poll-batch", 1, _CPU),
    ("--rope-scaling", 1, _ROPE), ("--rope-scale", 1, _ROPE), ("--rope-freq-base", 1, _ROPE),
    ("--rope-freq-scale", 1, _ROPE), ("--yarn-orig-ctx", 1, _ROPE), ("--yarn-ext-factor", 1, _ROPE),
    ("--yarn-attn-factor", 1, _ROPE), ("--yarn-beta-slow", 1, _ROPE), ("--yarn-beta-fast", 1, _ROPE),
    ("-kvo --kv-offload -nkvo --no-kv-offload", 0, "KV offload control: " + _MEM),
    ("--repack -nr --no-repack", 0, "weight repacking control: " + _MEM),
    ("--no-host", 0, "host buffer bypass: " + _MEM), ("--op-offload --no-op-offload", 0, "op offload: " + _MEM),
    ("--rpc", 1, "RPC backends are not implemented"),
    ("-lzm --lazy-mode", 1, "lazy tensor reading: " + _MEM),
    ("-ot --override-tensor", 1, "tensor buffer overrides: " + _MEM),
    ("-cmoe --cpu-moe", 0, "MoE placement: " + _MEM), ("-ncmoe --n-cpu-moe", 1, "MoE placement: " + _MEM),
    ("-ncffn --n-cpu-ffn", 1, "FFN placement: " + _MEM),
    ("-fit --fit", "?", "fitting arguments to device memory is not implemented (set -c/-ngl yourself)"),
    ("-fitt --fit-target", 1, "--fit is not implemented"), ("-fitc --fit-ctx", 1, "--fit is not implemented"),
    ("--check-tensors", 0, "tensor validation: " + _MEM),
    ("--override-kv", 1, "model metadata overrides are not implemented"),
    ("--lora", 1, "LoRA adapters are not implemented"), ("--lora-scaled", 1, "LoRA adapters are not implemented"),
    ("--lora-init-without-apply", 0, "LoRA adapters are not implemented"),
    ("--control-vector", 1, "control vectors are not implemented"),
    ("--control-vector-scaled", 1, "control vectors are not implemented"),
    ("--control-vector-layer-range", 2, "control vectors are not implemented"),
    ("-mu --model-url", 1, _DL), ("-dr --docker-repo", 1, _DL), ("-hf -hfr --hf-repo", 1, _DL),
    ("-hff --hf-file", 1, _DL), ("-hft --hf-token", 1, _DL), ("--embd-gemma-default", 0, _DL),
    ("--fim-qwen-1.5b-default", 0, _DL), ("--fim-qwen-3b-default", 0, _DL), ("--fim-qwen-7b-default", 0, _DL),
    ("--fim-qwen-7b-spec", 0, _DL), ("--fim-qwen-14b-spec", 0, _DL), ("--fim-qwen-30b-default", 0, _DL),
    ("--gpt-oss-20b-default", 0, _DL), ("--gpt-oss-120b-default", 0, _DL),
    ("--vision-gemma-4b-default", 0, _DL), ("--vision-gemma-12b-default", 0, _DL),
    ("--models-dir", 1, "router mode is not implemented (one model per instance)"),
    ("--models-preset", 1, "router mode is not implemented (one model per instance)"),
    ("--models-max", 1, "router mode is not implemented (one model per instance)"),
    ("--models-autoload --no-models-autoload", 0, "router mode is not implemented (one model per instance)"),
    ("-l --logit-bias", 1, _DEF),
    ("--grammar", 1, _DEF), ("--grammar-file", 1, _DEF), ("-j --json-schema", 1, _DEF),
    ("-jf --json-schema-file", 1, _DEF),
    ("--spec-draft-type-k -ctkd --cache-type-k-draft", 1, _SPEC),
    ("--spec-draft-type-v -ctvd --cache-type-v-draft", 1, _SPEC),
    ("--spec-draft-hf -hfd -hfrd --hf-repo-draft", 1, _SPEC),
    ("--spec-draft-threads -td --threads-draft", 1, _SPEC),
    ("--spec-draft-threads-batch -tbd --threads-batch-draft", 1, _SPEC),
    ("--spec-draft-cpu-mask -Cd --cpu-mask-draft", 1, _SPEC),
    ("--spec-draft-cpu-range -Crd --cpu-range-draft", 1, _SPEC),
    ("--spec-draft-cpu-strict --cpu-strict-draft", 1, _SPEC), ("--spec-draft-prio --prio-draft", 1, _SPEC),
    ("--spec-draft-poll --poll-draft", 1, _SPEC), ("--spec-draft-cpu-mask-batch -Cbd --cpu-mask-batch-draft", 1, _SPEC),
    ("--spec-draft-cpu-strict-batch --cpu-strict-batch-draft", 1, _SPEC),
    ("--spec-draft-prio-batch --prio-batch-draft", 1, _SPEC), ("--spec-draft-poll-batch --poll-batch-draft", 1, _SPEC),
    ("--spec-draft-override-tensor -otd --override-tensor-draft", 1, _SPEC),
    ("--spec-draft-cpu-moe -cmoed --cpu-moe-draft", 0, _SPEC),
    ("--spec-draft-n-cpu-moe --spec-draft-ncmoe -ncmoed --n-cpu-moe-draft", 1, _SPEC),
    ("--spec-draft-n-max", 1, _SPEC), ("--spec-draft-n-min", 1, _SPEC), ("--spec-synth-len", 1, _SPEC),
    ("--spec-synth-rates", 1, _SPEC), ("--spec-draft-p-split --draft-p-split", 1, _SPEC),
    ("--spec-draft-p-min --draft-p-min", 1, _SPEC),
    ("--spec-draft-backend-sampling --no-spec-draft-backend-sampling", 0, _SPEC),
    ("--spec-draft-device -devd --device-draft", 1, _SPEC),
    ("--spec-draft-ngl -ngld --gpu-layers-draft --n-gpu-layers-draft", 1, _SPEC),
    ("--spec-draft-model -md --model-draft", 1, _SPEC), ("--spec-type", 1, _SPEC),
    ("--spec-ngram-mod-n-min", 1, _SPEC), ("--spec-ngram-mod-n-max", 1, _SPEC),
    ("--spec-ngram-mod-n-match", 1, _SPEC), ("--spec-ngram-simple-size-n", 1, _SPEC),
    ("--spec-ngram-simple-size-m", 1, _SPEC), ("--spec-ngram-simple-min-hits", 1, _SPEC),
    ("--spec-ngram-map-k-size-n", 1, _SPEC), ("--spec-ngram-map-k-size-m", 1, _SPEC),
    ("--spec-ngram-map-k-min-hits", 1, _SPEC), ("--spec-ngram-map-k4v-size-n", 1, _SPEC),
    ("--spec-ngram-map-k4v-size-m", 1, _SPEC), ("--spec-ngram-map-k4v-min-hits", 1, _SPEC),
    ("--draft --draft-n --draft-max", 1, _SPEC), ("--draft-min --draft-n-min", 1, _SPEC),
    ("--spec-ngram-size-n", 1, _SPEC), ("--spec-ngram-size-m", 1, _SPEC), ("--spec-ngram-min-hits", 1, _SPEC),
    ("--spec-default", 0, _SPEC), ("-lcs --lookup-cache-static", 1, _SPEC),
    ("-lcd --lookup-cache-dynamic", 1, _SPEC),
    ("--kv-unified-per-slot", 1, "per-slot context limits are not implemented (a slot gets -c / -np)"),
    ("-r --reverse-prompt", 1, "not implemented (send stop per request)"),
    ("-sp --special", 0, "not implemented"),
    ("--spm-infill", 0, "the Suffix/Prefix/Middle infill order is not implemented"),
    ("-mm --mmproj", 1, _MM), ("-mmu --mmproj-url", 1, _MM), ("-mmdev --mmproj-device", 1, _MM),
    ("--image-min-tokens", 1, _MM), ("--image-max-tokens", 1, _MM), ("--mtmd-batch-max-tokens", 1, _MM),
    ("--video-fps", 1, _MM), ("--video-timestamp-interval", 1, _MM), ("--video-ffmpeg-dir", 1, _MM),
    ("--media-path", 1, _MM),
    ("--reuse-port", 0, "not implemented (run several instances behind one balancer: docs/DEPLOYMENT.md)"),
    ("--path", 1, "serving static files is not implemented"),
    ("--api-prefix", 1, "not implemented (a reverse proxy can strip a prefix)"),
    ("--ui-config --webui-config", 1, "UI settings are not implemented"),
    ("--ui-config-file --webui-config-file", 1, "UI settings are not implemented"),
    ("--tools", 1, "built-in agent tools are not implemented"),
    ("--tools-runtime", 1, "built-in agent tools are not implemented"),
    ("--mcp-servers-config", 1, "MCP servers are not implemented"),
    ("--mcp-servers-json", 1, "MCP servers are not implemented"),
    ("-ag --agent -no-ag --no-agent", 0, "built-in agent tools are not implemented"),
    ("--ssl-key-file", 1, "TLS is not implemented (terminate it in nginx: docs/DEPLOYMENT.md)"),
    ("--ssl-cert-file", 1, "TLS is not implemented (terminate it in nginx: docs/DEPLOYMENT.md)"),
    ("--chat-template-kwargs", 1, "not implemented as a server default (send chat_template_kwargs per request)"),
    ("-rea --reasoning", "?", "not implemented"), ("--reasoning-effort", 1, "not implemented"),
    ("--reasoning-budget-message", 1, "not implemented"),
    ("--reasoning-preserve --no-reasoning-preserve", 0, "not implemented"),
    ("--skip-chat-parsing --no-skip-chat-parsing", 0, "not implemented"),
]


def table() -> list[tuple[list[str], int | str, str, bool]]:
    """(option strings, values, why, accepted) for every row."""
    return ([(r[0].split(), r[1], r[2], True) for r in ACCEPTED]
            + [(r[0].split(), r[1], r[2], False) for r in REFUSED])
