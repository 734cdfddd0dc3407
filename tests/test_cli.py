"""The ringserve command line: llama-server's flags, ignored ones, defaults."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from frontends.cli import parse  # noqa: E402


def test_cli_accepts_llama_server_flags():
    cfg, opts = parse(["-m", "m.gguf", "-c", "2048", "-np", "3", "-n", "9", "-t", "2", "-b", "64", "-ub", "32",
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
    assert not cfg.cache_prompt and (cfg.workers, cfg.http_threads) == (3, 5) and opts.gunicorn_config == "g.py"
    assert "--jinja" in opts.ignored and "--made-up" in opts.ignored and "--cache-ram" in opts.ignored
    d, _ = parse([])
    assert (d.host, d.port, d.temp, d.top_k, d.slots, d.cache_prompt) == ("127.0.0.1", 8080, 0.8, 40, True, True)


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


def test_gpu_flags_and_default_workers():
    from engine.config import default_workers

    cfg, opts = parse(["-bs", "-ngl", "99"])
    assert cfg.backend_sampling and cfg.n_gpu_layers == 99 and not opts.ignored
    assert parse(["--backend-sampling"])[0].backend_sampling and not parse([])[0].backend_sampling
    assert parse([])[0].workers == default_workers() == max(2, min((os.cpu_count() or 2) // 2, 8))
    assert [default_workers(c) for c in (1, 2, 4, 8, 16, 17, 64)] == [2, 2, 2, 4, 8, 8, 8]
    assert parse(["-w", "5"])[0].workers == 5


def test_webui_flags():
    """The chat page is on by default, as llama-server's UI; its four flag spellings work."""
    assert parse([])[0].webui is True
    for flag in ("--no-webui", "--no-ui"):
        cfg, opts = parse([flag])
        assert cfg.webui is False and not opts.ignored
    assert parse(["--no-webui", "--ui"])[0].webui is True and parse(["--no-ui", "--webui"])[0].webui is True
