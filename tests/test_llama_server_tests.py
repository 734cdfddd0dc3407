"""llama.cpp's own server tests (tools/server/tests) against ringserve: a quick subset.

scripts/llama_server_tests.py runs the vendored test files with ringserve
behind the tests' server-binary path; here the ones this repository fixed to
behave as llama-server does (header spelling, CORS, --tools' CORS default, the
text-part prefill, --sleep-idle-seconds), which llama-server passes with the
same model (the script's side-by-side table). Plus the header spelling at
the WSGI level, where a case-insensitive client cannot hide it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import falcon.testing
import pytest

from frontends import testing
from frontends.testing.client import TestClient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "llama_server_tests.py")
TESTS = "/root/.cache/ringserve/llama.cpp-0.3.36/src/tools/server/tests/unit"

# the sleep tests include /metrics' per-scrape windows and the asleep snapshot (frontends/api/metrics.py);
# /cors-proxy's disabled answer (test_proxy.py's other cases need example.com)
# one server start per case: of the parametrized CORS cases, those of the headers ringserve spelled
# differently (Allow-Origin with the localhost origin: the web.mydomain.fr one reflects its Origin
# through the same path on the same server; Allow-Credentials) and two of the six localhost origins
QUICK = ("(cors_options and (localhost or Credentials)) or defaults_to_localhost_with_tools "
         "or (localhost_reflects and 127) or assistant_prefill "
         "or test_server_sleep or test_metrics_prompt_processed or prometheus_format or slots_idle_after_completion "
         "or mcp_no_proxy or cors_proxy_only_forwards")
# test_template.py's cases with a tool and reasoning "auto" or the date (see test_llama_cpp_template_tests):
# DeepSeek R1, QwQ and Qwen 3 (three reasoning shapes) and Llama 3.3's date; Command R7B and firefunction's
# date were two more server starts for the same paths (the suite's time)
TEMPLATE = "tools2 and ((auto and not c4ai) or (date_inside and 70B))"
# one run of the script for both tests below (one copy of the tests, one collection), three pytest
# processes at once, the files dealt round-robin: sleep + metrics, security + chat, template + proxy,
# so the sleep tests' idle waits overlap the other files' server starts (measured, alone: 36 s with
# two processes, 26 s with three, 39 s with one per file)
FILES = ["test_sleep.py", "test_security.py", "test_template.py", "test_metrics.py", "test_chat_completion.py",
         "test_proxy.py"]
NEEDS = pytest.mark.skipif(testing.models.smollm2() is None or not os.path.isdir(TESTS),
                           reason="needs SmolLM2 (test extra) and the vendored llama.cpp sources")


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    """The script's JSON rows for QUICK and TEMPLATE over FILES, ringserve only (a case
    that does not pass brings the tail of its server's output, ``log``)."""
    r = subprocess.run([sys.executable, SCRIPT, "--target", "ringserve", "--json", "--timeout", "500", "--jobs", "3",
                        "-f", *FILES, "-k", f"({QUICK}) or ({TEMPLATE})"], capture_output=True, text=True,
                       timeout=600, env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)

def test_header_names_are_spelled_as_llama_server():
    """The names gunicorn writes (start_response's list), not a case-folding dict."""
    c = TestClient("--metrics")
    try:
        got = []
        env = falcon.testing.create_environ("/metrics", headers={"Origin": "http://x"})
        b"".join(c.app(env, lambda status, hdrs, exc=None: got.extend(hdrs)))
        names = [k for k, _ in got]
        assert "Access-Control-Allow-Origin" in names and "Process-Start-Time-Unix" in names, names
        assert "Content-Type" in names, names
        assert all(k[:1].isupper() for k in names), names
        got.clear()
        env = falcon.testing.create_environ("/health", method="OPTIONS", headers={"Origin": "http://x"})
        b"".join(c.app(env, lambda status, hdrs, exc=None: got.extend(hdrs)))
        names = [k for k, _ in got]
        for k in ("Access-Control-Allow-Credentials", "Access-Control-Allow-Methods", "Access-Control-Allow-Headers"):
            assert k in names, names
    finally:
        c.close()


def test_tools_default_cors_to_localhost():
    from frontends.process.cli import parse

    assert parse(["--tools", "all"])[0].cors_origins == "localhost"
    assert parse(["--tools", "all", "--cors-origins", "*"])[0].cors_origins == "*"
    assert parse([])[0].cors_origins == "*"


@pytest.mark.parametrize("bad", ["0", "-2"])
def test_sleep_idle_seconds_refuses_llama_servers_invalid_values(bad, capsys):
    from frontends.process.cli import parse

    with pytest.raises(SystemExit):
        parse(["--sleep-idle-seconds", bad])
    assert "cannot be 0 or less than -1" in capsys.readouterr().err


@NEEDS
def test_llama_cpp_server_tests_quick_subset(rows):
    quick = [x for x in rows if not x["test"].startswith("test_template::")]
    assert len(quick) >= 12, f"too few tests ran: {quick}"
    bad = [f"{x['test']}: {x['why']}\n{x['log']}" for x in quick if x["ringserve"] != "pass"]
    assert not bad, "\n".join(bad)


@NEEDS
def test_llama_cpp_template_tests(rows):
    """llama.cpp's test_template.py (/apply-template: reasoning on/off/auto under
    DeepSeek R1, Qwen 3, QwQ and Command R7B, the date in Llama 3.3's and
    firefunction v2's prompts, add_generation_prompt), which llama-server
    passes too: here 4 cases with a tool and reasoning "auto" or the date
    (a server start each: the suite's time); ``scripts/llama_server_tests.py -f test_template.py`` runs
    all 35 (35/35 on both servers, docs/ARCHITECTURE.md)."""
    tmpl = [x for x in rows if x["test"].startswith("test_template::")]
    assert len(tmpl) == 4, f"not every case ran: {tmpl}"
    bad = [f"{x['test']}: {x['why']}\n{x['log']}" for x in tmpl if x["ringserve"] != "pass"]
    assert not bad, "\n".join(bad)
