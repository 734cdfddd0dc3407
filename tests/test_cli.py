"""The ringserve command line: llama-server's flags, ignored ones, defaults."""
from __future__ import annotations

import importlib
import os
import shlex
from dataclasses import fields

from engine.config import Config, csv_list, directory, gpu_layers, kv_events, on_off
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
                       "--jinja", "-cb", "--kv-unified", "--offline", "--cache-ram", "0", "--sleep-idle-seconds",
                       "-1", "--slot-save-path", "/tmp", "-v", "--log-file", "x", "--made-up", "7"])
    assert (cfg.model, cfg.ctx_size, cfg.parallel, cfg.n_predict, cfg.threads) == ("m.gguf", 2048, 3, 9, 2)
    assert (cfg.batch_size, cfg.ubatch_size, cfg.flash_attn, cfg.host, cfg.port) == (64, 32, "off", "0.0.0.0", 9)
    assert cfg.api_keys == ["k1", "k2"] and cfg.metrics and not cfg.slots and cfg.timeout == 60
    assert (cfg.seed, cfg.temp, cfg.top_k, cfg.top_p, cfg.min_p) == (5, 0.1, 7, 0.5, 0.2)
    assert not cfg.cache_prompt and (cfg.workers, cfg.http_threads) == (3, 5) and cfg.gunicorn_config == "g.py"
    assert "--jinja" in ignored and "--made-up" in ignored and "--cache-ram" not in ignored and cfg.cache_ram == 0
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


def test_step_budget_flags():
    d, _ = parse([])
    assert (d.step_tokens, d.step_mult) == (0, 3.0)  # adaptive by default
    cfg, _ = parse(["--step-tokens", "256", "--step-mult", "0.5"])
    assert (cfg.step_tokens, cfg.step_mult) == (256, 1.0)  # a multiple below one pure step means nothing
    assert parse(["--step-tokens", "-1"])[0].step_tokens == -1
    assert d.admit == "fifo" and parse(["--admit", "srf"])[0].admit == "srf"  # prompt admission (issue 24)


def test_gpu_flags_and_default_workers():
    from engine.config import default_workers

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
    if typ is int or typ is gpu_layers:
        v = max(default, f.metadata["lo"] or 0) + 7
        return [str(v)], v
    if typ is float:
        return [str(default + 0.25)], default + 0.25
    if typ is on_off:
        return ["off"], "off"
    if typ is csv_list:
        return ["k1,k2"], ["k1", "k2"]
    if kw.get("choices"):
        return [kw["choices"][-1]], kw["choices"][-1]
    if typ is directory:
        return ["/tmp"], "/tmp"
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
        if not flags:
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


def test_lo_clamps_and_env_default(monkeypatch):
    cfg, _ = parse(["-np", "0", "-w", "-3", "--threads-http", "0", "--fail-queue-depth", "-2"])
    assert (cfg.parallel, cfg.workers, cfg.http_threads, cfg.queue_fail_depth) == (1, 1, 1, 0)
    monkeypatch.setenv("RINGSERVE_ENGINE_CMD", "fake --x")
    assert parse([])[0].engine_cmd == "fake --x"
    assert parse(["--engine-cmd", "y"])[0].engine_cmd == "y"
