"""The ringserve command line: llama-server's flags, the strict rule (accepted
with no effect, refused, unknown), defaults."""
from __future__ import annotations

import importlib
import os
import shlex
from dataclasses import fields

import re
import subprocess

import pytest

from engine.config import Config
from engine.setting import (
    Breakers, SamplerOrder, count, csv_list, device_list, directory, dry_base, finite, gpu_layers, idle_seconds,
    kv_events, kv_type, on_off, penalty, proportions, spec_types,
)
from engine.process import child_env
from frontends.process import gunicorn_conf
from frontends.process.cli import parse
from frontends.process.serve import settings


def test_cli_accepts_llama_server_flags():
    cfg, ignored = parse(["-m", "m.gguf", "-c", "2048", "-np", "3", "-n", "9", "-t", "2", "-b", "64", "-ub", "32",
                       "-ngl", "0", "-fa", "off", "--host", "0.0.0.0", "--port", "9", "-a", "x,y",
                       "--api-key", "k1,k2", "--metrics", "--no-slots", "-to", "60", "-s", "5", "--temp", "0.1",
                       "--top-k", "7", "--top-p", "0.5", "--min-p", "0.2", "--no-cache-prompt", "--no-webui",
                       "-w", "3", "--threads-http", "5", "--config", "g.py",
                       "--jinja", "-cb", "--no-kv-unified", "--offline", "--cache-ram", "0", "--sleep-idle-seconds",
                       "-1", "--slot-save-path", "/tmp", "-v", "--log-file", "x"])
    assert (cfg.model, cfg.ctx_size, cfg.parallel, cfg.n_predict, cfg.threads) == ("m.gguf", 2048, 3, 9, 2)
    assert (cfg.batch_size, cfg.ubatch_size, cfg.flash_attn, cfg.host, cfg.port) == (64, 32, "off", "0.0.0.0", 9)
    assert cfg.api_keys == ["k1", "k2"] and cfg.metrics and not cfg.slots and cfg.timeout == 60
    assert (cfg.seed, cfg.temp, cfg.top_k, cfg.top_p, cfg.min_p) == (5, 0.1, 7, 0.5, 0.2)
    assert not cfg.cache_prompt and (cfg.workers, cfg.http_threads) == (3, 5) and cfg.gunicorn_config == "g.py"
    assert any(x.startswith("-cb (") for x in ignored) and any(x.startswith("--log-file x (") for x in ignored)
    assert not any("--cache-ram" in x for x in ignored) and cfg.cache_ram == 0
    assert cfg.slot_save_path == "/tmp" and "--slot-save-path" not in ignored
    d, _ = parse([])
    assert (d.host, d.port, d.temp, d.top_k, d.slots, d.cache_prompt) == ("127.0.0.1", 8080, 0.8, 40, True, True)
    assert d.prefix_cache and d.cache_ram == 8192  # llama-server's default host cache size


def test_api_key_file(tmp_path):
    f = tmp_path / "keys"
    f.write_text("a\n\n# c\nb\n")
    cfg, _ = parse(["--api-key", "z", "--api-key-file", str(f)])
    assert cfg.api_keys == ["z", "a", "b"]


def test_lifecycle_flags():
    cfg, _ = parse(["--fail-queue-depth", "3", "--graceful-timeout", "9", "--access-logfile", "/tmp/a.log",
                    "--access-logformat", "%(s)s"])
    assert (cfg.queue_fail_depth, cfg.graceful_timeout) == (3, 9)
    assert (cfg.access_log, cfg.access_log_format) == ("/tmp/a.log", "%(s)s")
    d, _ = parse([])
    assert (d.queue_fail_depth, d.graceful_timeout, d.access_log, d.access_log_format) == (0, -1, "", "")


def test_sse_ping_interval_flag(monkeypatch):
    """--sse-ping-interval (accepted and ignored before): llama-server's default 30 s, -1 off, its
    LLAMA_ARG_ variable; what a stream does with it: tests/test_sse_ping.py."""
    monkeypatch.delenv("LLAMA_ARG_SSE_PING_INTERVAL", raising=False)
    cfg, ignored = parse(["--sse-ping-interval", "-1"])
    assert cfg.sse_ping_interval == -1 and not ignored and parse([])[0].sse_ping_interval == 30
    monkeypatch.setenv("LLAMA_ARG_SSE_PING_INTERVAL", "7")
    assert parse([])[0].sse_ping_interval == 7


def test_step_budget_flags():
    d, _ = parse([])
    assert (d.step_tokens, d.step_mult) == (0, 3.0)  # adaptive by default
    cfg, _ = parse(["--step-tokens", "256", "--step-mult", "0.5"])
    assert (cfg.step_tokens, cfg.step_mult) == (256, 1.0)  # a multiple below one pure step means nothing
    assert parse(["--step-tokens", "-1"])[0].step_tokens == -1
    assert d.admit == "fifo" and parse(["--admit", "srf"])[0].admit == "srf"  # prompt admission (issue 24)


def test_gpu_flags_and_default_workers():
    from engine.setting import default_workers

    cfg, ignored = parse(["-bs", "-ngl", "99"])
    assert cfg.backend_sampling and cfg.n_gpu_layers == 99 and not ignored
    assert parse(["--backend-sampling"])[0].backend_sampling and not parse([])[0].backend_sampling
    assert parse([])[0].workers == default_workers() == max(2, min((os.cpu_count() or 2) // 2, 8))
    assert [default_workers(c) for c in (1, 2, 4, 8, 16, 17, 64)] == [2, 2, 2, 4, 8, 8, 8]
    assert parse(["-w", "5"])[0].workers == 5


def test_webui_flags():
    """The chat page is on by default, as llama-server's UI; its four flag spellings work."""
    assert parse([])[0].webui is True
    for flag in ("--no-webui", "--no-ui"):
        cfg, ignored = parse([flag])
        assert cfg.webui is False and not ignored
    assert parse(["--no-webui", "--ui"])[0].webui is True and parse(["--no-ui", "--webui"])[0].webui is True


def _other(f, default):
    """A command-line value for setting ``f`` that differs from its default,
    and the value the Config must then hold."""
    kw = f.metadata["arg"]
    act, typ = kw.get("action"), kw.get("type")
    if act == "store_true":
        return [], True
    if act == "store_false":
        return [], False
    if act == "store_bool":
        return (["--no-" + f.metadata["flags"][-1][2:]], False) if default else ([], True)
    if act is Breakers:
        return ["x", "--dry-sequence-breaker", "y"], ["x", "y"]
    if act is SamplerOrder:
        return ["kt"], "kt"  # flags[-1] is --sampling-seq: chars
    if kw.get("choices") and typ is int:
        return [str(kw["choices"][-1])], kw["choices"][-1]
    if typ in (int, gpu_layers, idle_seconds, count):
        v = max(default, f.metadata["lo"] or 0) + 7
        return [str(v)], v
    if typ in (float, finite, penalty, dry_base):
        return [str(default + 0.25)], default + 0.25
    if typ is on_off:
        return ["off"], "off"
    if typ is csv_list:
        return ["k1,k2"], ["k1", "k2"]
    if typ is kv_type:  # not a quantized V: the argv also says -fa off
        return ["bf16"], "bf16"
    if typ is proportions:
        return ["3,1"], [3.0, 1.0]
    if typ is device_list:
        return ["Dev0, Dev1"], "Dev0,Dev1"
    if kw.get("choices"):
        return [kw["choices"][-1]], kw["choices"][-1]
    if typ is directory:
        return ["/tmp"], "/tmp"
    if typ is spec_types:
        return ["ngram-map-k"], "ngram-map-k"
    if typ is kv_events:  # off: this argv also flips --no-prefix-cache and --embedding, which events refuse
        v = '{"enable_kv_cache_events": false, "endpoint": "tcp://*:5557"}'
        return [v], v
    return [f"x-{f.name}"], f"x-{f.name}"


def test_every_setting_reaches_its_processes(tmp_path, monkeypatch):
    """Every declared flag, given a non-default value, lands in the Config
    the launcher holds, in the one the engine and the workers read back from
    RINGSERVE_CONFIG (child_env: the path the ringserve supervisor and a
    plain gunicorn master both use), and in gunicorn's settings."""
    argv, want = [], {}
    for f in fields(Config):
        flags = f.metadata.get("flags")
        if not flags or f.name == "cache_host":  # refused beside --no-prefix-cache / --embedding: checked below
            continue
        args, value = _other(f, getattr(Config(), f.name))
        argv += [flags[-1]] + args if not (args and args[0].startswith("--no-")) else args
        want[f.name] = value
        assert f.metadata["used"], f"{f.name}: no process uses it"
    (tmp_path / "k").write_text("k3\n")
    (tmp_path / "t").write_text("{{ messages }}")
    argv += ["--api-key-file", str(tmp_path / "k"), "--chat-template-file", str(tmp_path / "t")]
    want["api_keys"] += ["k3"]
    want["chat_template"] = "{{ messages }}"
    want["gunicorn_config"] = ""  # a real file is needed by gunicorn below
    argv[argv.index("x-gunicorn_config")] = ""

    cfg, ignored = parse(argv)
    assert not ignored
    assert {k: getattr(cfg, k) for k in want} == want
    cfg.arena = "rs_test"
    for env in (child_env(cfg),):  # engine (procs.EngineProc, EngineProcess) and gunicorn master -> workers
        monkeypatch.setenv("RINGSERVE_CONFIG", env["RINGSERVE_CONFIG"])
        assert Config.from_env() == cfg
    g = settings(cfg)
    assert (g.workers, g.threads, g.timeout, g.graceful_timeout) == (
        cfg.workers, cfg.http_threads, cfg.timeout, cfg.graceful_timeout)
    assert (g.accesslog, g.access_log_format) == (cfg.access_log, cfg.access_log_format)
    # plain gunicorn: RINGSERVE_ARGS, parsed once by gunicorn_conf.py, handed to hooks.on_starting
    monkeypatch.setenv("RINGSERVE_ARGS", shlex.join(argv))
    conf = importlib.reload(gunicorn_conf)
    assert conf._cfg == parse(argv)[0]
    assert (conf.workers, conf.threads, conf.timeout) == (cfg.workers, cfg.http_threads, cfg.timeout)
    h = parse(["--cache-host", str(tmp_path / "h")])[0]  # a flag the argv above cannot hold (its prefix cache is off)
    h.arena = "rs_test"
    monkeypatch.setenv("RINGSERVE_CONFIG", child_env(h)["RINGSERVE_CONFIG"])
    assert Config.from_env().cache_host == str(tmp_path / "h")


def test_lo_clamps_and_env_default(monkeypatch):
    cfg, _ = parse(["-w", "-3", "--threads-http", "0", "--fail-queue-depth", "-2"])
    assert (cfg.workers, cfg.http_threads, cfg.queue_fail_depth) == (1, 1, 0)
    monkeypatch.setenv("RINGSERVE_ENGINE_CMD", "fake --x")
    assert parse([])[0].engine_cmd == "fake --x"
    assert parse(["--engine-cmd", "y"])[0].engine_cmd == "y"


def test_llama_server_environment_variables(monkeypatch, capsys):
    """LLAMA_ARG_* and LLAMA_API_KEY read as llama-server reads them (they
    were ignored: a key set this way left the server open): the variable
    is its flag, the command line wins, a refused flag's variable refuses
    the start, switches take llama-server's true/false words and
    LLAMA_ARG_NO_<NAME>; HF_TOKEN (a download credential) is not read."""
    for k in [k for k in os.environ if k.startswith("LLAMA_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("LLAMA_API_KEY", "secret")
    monkeypatch.setenv("LLAMA_ARG_CTX_SIZE", "8192")
    monkeypatch.setenv("LLAMA_ARG_N_PARALLEL", "2")
    monkeypatch.setenv("LLAMA_ARG_NO_CONTEXT_SHIFT", "1")
    monkeypatch.setenv("LLAMA_ARG_ENDPOINT_METRICS", "true")
    monkeypatch.setenv("HF_TOKEN", "hf_x")
    cfg, _ = parse([])
    assert (cfg.api_keys, cfg.ctx_size, cfg.parallel, cfg.metrics) == (["secret"], 8192, 2, True)
    assert not cfg.context_shift
    cfg, _ = parse(["-c", "1024", "--api-key", "k2"])  # the command line wins
    assert (cfg.api_keys, cfg.ctx_size) == (["k2"], 1024)
    monkeypatch.setenv("LLAMA_ARG_CONTEXT_SHIFT", "on")
    monkeypatch.delenv("LLAMA_ARG_NO_CONTEXT_SHIFT")
    assert parse([])[0].context_shift
    monkeypatch.setenv("LLAMA_ARG_CONTEXT_SHIFT", "maybe")
    assert "LLAMA_ARG_CONTEXT_SHIFT: 'maybe' is neither true nor false" in _usage_error(capsys, [])
    monkeypatch.delenv("LLAMA_ARG_CONTEXT_SHIFT")
    monkeypatch.setenv("LLAMA_ARG_ROPE_FREQ_BASE", "10000")
    assert "argument --rope-freq-base: not supported by ringserve" in _usage_error(capsys, [])


def test_llama_server_argument_spellings(capsys):
    """"--ctx_size" is "--ctx-size" (llama-server turns "_" into "-" in "--"
    options), an option's value may start with "-"; -np 0 and -1 (auto) are
    refused, not read as 1; -lv above 9 is -v (params.verbose); -kvu, which
    would change the longest prompt a slot takes, is refused; --no-jinja is
    a setting (llama.cpp's own server tests pass it)."""
    cfg, _ = parse(["--ctx_size", "768", "--n_gpu_layers", "0", "--api-key", "-Xyz", "--alias", "-name"])
    assert (cfg.ctx_size, cfg.api_keys, cfg.alias) == (768, ["-Xyz"], "-name")
    assert "invalid value 0" in _usage_error(capsys, ["-np", "0"])
    assert "-1 (auto" in _usage_error(capsys, ["-np", "-1"])
    assert parse(["-lv", "10"])[0].verbose and not parse(["-lv", "9"])[0].verbose
    for flag in ("-kvu", "--kv-unified"):
        assert f"argument {flag}: not supported by ringserve" in _usage_error(capsys, [flag])
    assert not parse(["--no-jinja"])[0].jinja and parse(["--jinja"])[0].jinja and parse([])[0].jinja


ARG_CPP = os.path.expanduser("~/.cache/ringserve/llama.cpp-0.3.36/src/common/arg.cpp")


@pytest.mark.skipif(not os.path.exists(ARG_CPP), reason="the vendored llama.cpp sources are absent")
def test_environment_table_is_llama_servers():
    """llamaenv.ENV is every set_env of the vendored common/arg.cpp whose
    flag ringserve's parser knows, with the same flags (but HF_TOKEN)."""
    from frontends.process.cli import parser
    from frontends.process.llamaenv import ENV

    src = open(ARG_CPP).read()
    known = parser()._option_string_actions
    want = {}
    for chunk in src.split("add_opt(common_arg(")[1:]:  # one option each: its flags' list first, its set_env in it
        env = re.search(r'set_env\("([A-Z0-9_]+)"\)', chunk)
        flags = re.findall(r'"([^"]*)"', re.search(r"\{([^}]*)\}", chunk).group(1))
        if env and any(f in known for f in flags) and env.group(1) != "HF_TOKEN":
            want[env.group(1)] = " ".join(flags)
    got = {env: flags for env, flags, _, _ in ENV}
    assert got == want


def _usage_error(capsys, argv: list[str]) -> str:
    """parse(argv) must exit 2 (argparse's usage error); its message."""
    with pytest.raises(SystemExit) as e:
        parse(argv)
    assert e.value.code == 2, argv
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_unknown_and_refused_flags_exit_2(capsys):
    """A typo or a llama-server flag that cannot apply stops the start,
    naming the flag and why; a short option never swallows a longer
    llama-server flag (-md x is not -m d); -mx is no flag at all."""
    assert "unrecognized arguments: --ctx-sise 8192" in _usage_error(capsys, ["--ctx-sise", "8192"])
    for argv, why in ((["--lora", "a.gguf"], "LoRA"), (["--mmproj", "m.gguf"], "multimodal"),
                      (["--rope-freq-base", "1e4"], "RoPE"),
                      (["--control-vector-layer-range", "1", "2"], "control vectors"), (["-hf", "x/y"], "download")):
        msg = _usage_error(capsys, ["-c", "64", *argv])
        assert f"argument {argv[0]}: not supported by ringserve: " in msg and why in msg, msg
    assert parse(["-md", "draft.gguf"])[0].spec_draft_model == "draft.gguf"  # -md is the draft model, not -m d
    assert "unrecognized arguments: -mx" in _usage_error(capsys, ["-mx"])
    assert "unrecognized arguments: -tbx" in _usage_error(capsys, ["-tbx"])
    cfg, _ = parse(["-tb", "3", "-t", "2"])
    assert (cfg.threads, cfg.threads_batch, cfg.n_threads_batch) == (2, 3, 3)
    assert parse(["-t", "2"])[0].n_threads_batch == 2  # -tb's default: --threads


def test_kv_and_device_flags():
    cfg, acc = parse(["-ctk", "q8_0", "--cache-type-v", "Q4_0", "-fa", "on", "-dev", "none", "-sm", "row",
                      "-ts", "3/1", "-mg", "1", "--numa", "isolate", "--no-mmap", "--mlock", "-lm", "dio",
                      "--props"])
    assert (cfg.cache_type_k, cfg.cache_type_v, cfg.device, cfg.split_mode) == ("q8_0", "q4_0", "none", "row")
    assert (cfg.tensor_split, cfg.main_gpu, cfg.numa, cfg.mmap, cfg.mlock) == ([3.0, 1.0], 1, "isolate", False, True)
    assert cfg.load_mode == "dio" and cfg.props and not acc
    d = parse([])[0]
    assert (d.cache_type_k, d.cache_type_v, d.load_mode, d.mmap, d.mlock, d.numa, d.device) == (
        "f16", "f16", "auto", True, False, "", "")
    assert (d.split_mode, d.tensor_split, d.main_gpu, d.props) == ("layer", [], 0, False)


def test_quantized_v_needs_flash_attention(capsys):
    """llama.cpp refuses a quantized V cache with flash attention off
    (llama_init_from_model); the command line says so before anything starts."""
    msg = _usage_error(capsys, ["-fa", "off", "-ctv", "q8_0"])
    assert "-ctv/--cache-type-v" in msg and "requires flash_attn" in msg
    assert "Unsupported cache type: q9" in _usage_error(capsys, ["-ctk", "q9"])
    for fa in ("on", "auto"):
        assert parse(["-fa", fa, "-ctv", "q8_0"])[0].cache_type_v == "q8_0"
    assert parse(["-fa", "off", "-ctk", "q8_0", "-ctv", "bf16"])[0].cache_type_k == "q8_0"  # K alone: fine


def test_help_lists_accepted_flags(capsys):
    with pytest.raises(SystemExit):
        parse(["--help"])
    out = capsys.readouterr().out
    assert "accepted with no effect here" in out and "--cont-batching" in out and "batching is always continuous" in out
    assert "-ctk" in out and "--lora" not in out  # refused flags: the epilog says how they fail


LLAMA_SERVER = os.path.expanduser("~/.cache/ringserve/llama.cpp-0.3.36/build/bin/llama-server")


def _llama_server_flags() -> list[tuple[list[str], bool]]:
    """(option strings, takes a value) of every option `llama-server --help` lists."""
    out = subprocess.run([LLAMA_SERVER, "--help"], capture_output=True, text=True, timeout=60).stdout
    rows = []
    for line in out.splitlines():
        if not line.startswith("-") or line.startswith("-----"):
            continue
        head = re.split(r"\s{2,}", re.sub(r",\s+", ", ", line.rstrip()))[0]
        names, hint = [], ""
        for part in head.split(", "):
            tok = part.split(" ", 1)
            if not tok[0].startswith("-") or hint:
                break
            names.append(tok[0])
            hint = tok[1] if len(tok) > 1 else ""
        rows.append((names, bool(hint)))
    return rows


@pytest.mark.skipif(not os.path.exists(LLAMA_SERVER), reason="the vendored llama-server is not built")
def test_every_llama_server_flag_is_registered():
    """Every flag of the vendored llama-server is a setting, accepted or
    refused (none falls to "unrecognized" or into a shorter one), and the
    table's value counts agree with llama-server's."""
    from frontends.process import llamaflags
    from frontends.process.cli import parser

    p = parser()
    rows = _llama_server_flags()
    assert len(rows) > 200
    takes = {n: v for names, v in rows for n in names}
    missing = [n for n in takes if n not in p._option_string_actions]
    assert not missing, missing
    for names, n, _, _ in llamaflags.table():
        for name in names:
            if name in takes:
                assert bool(n) == takes[name], (name, n)


def test_list_devices(capsys):
    """llama-server's --list-devices: ggml's non-CPU devices (none in a CPU build), exit 0."""
    with pytest.raises(SystemExit) as e:
        parse(["--list-devices"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("Available devices:")


def test_cache_host_needs_the_prefix_cache(capsys):
    """--cache-host offers and loads the prefix cache's entries: refused at the command line where there is none."""
    for extra in (["--no-prefix-cache"], ["--embedding"], ["--reranking"]):
        msg = _usage_error(capsys, ["--cache-host", "/dev/shm/x", *extra])
        assert "--cache-host" in msg and "prefix cache" in msg, extra
    assert parse(["--cache-host", "/dev/shm/x"])[0].cache_host == "/dev/shm/x"
