"""llama-server parity of pure frontend behaviour (issue 16's first half),
in-process on the fake engine (testing.TestClient): CORS, names, chat
template options, input token counts, request-field edge cases. What
depends on the model is in tests/test_parity_real.py."""
from __future__ import annotations

import pytest

from engine.config import Config
from frontends.serve import binds
from frontends.testing import TestClient


@pytest.fixture(scope="module")
def srv():
    with TestClient("-a", "zeta, alpha,,alpha", "--tags", "t2, t1") as c:
        yield c


# ------------------------------------------------------------------ CORS
def test_cors_default_echoes_any_origin(srv):
    """llama-server's defaults (--cors-origins * with credentials): the
    Origin is echoed on every answer, errors included; none without one."""
    r = srv.simulate_get("/health", headers={"Origin": "http://example.com:9"})
    assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == "http://example.com:9"
    r = srv.simulate_post("/completion", json={}, headers={"Origin": "https://a.b"})
    assert r.status_code == 400 and r.headers["Access-Control-Allow-Origin"] == "https://a.b"
    assert "Access-Control-Allow-Origin" not in srv.simulate_get("/health").headers


def test_cors_preflight_any_path(srv):
    for path in ("/v1/chat/completions", "/no/such/path"):
        r = srv.simulate_options(path, headers={"Origin": "http://localhost:3000",
                                                "Access-Control-Request-Method": "POST"})
        assert r.status_code == 200 and r.content == b""
        assert r.headers["Content-Type"].startswith("text/html")
        assert r.headers["Access-Control-Allow-Origin"] == "http://localhost:3000"
        assert r.headers["Access-Control-Allow-Credentials"] == "true"
        assert r.headers["Access-Control-Allow-Methods"] == "GET, POST, DELETE, OPTIONS"
        assert r.headers["Access-Control-Allow-Headers"] == "*"


def test_cors_flags_and_gates():
    """--cors-origins localhost reflects only local origins; a preflight
    passes the API-key gate and a loading server; a 401 keeps the header."""
    with TestClient("--cors-origins", "localhost", "--api-key", "k", "--no-cors-credentials",
                    "--cors-methods", "GET", "--cors-headers", "X-A", loading=True) as c:
        r = c.simulate_options("/v1/models", headers={"Origin": "http://127.0.0.1:5"})
        assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == "http://127.0.0.1:5"
        assert (r.headers["Access-Control-Allow-Credentials"], r.headers["Access-Control-Allow-Methods"],
                r.headers["Access-Control-Allow-Headers"]) == ("false", "GET", "X-A")
        c.ready()
        r = c.simulate_get("/v1/models", headers={"Origin": "http://[::1]:8"})
        assert r.status_code == 401 and r.headers["Access-Control-Allow-Origin"] == "http://[::1]:8"
        r = c.simulate_get("/v1/models", headers={"Origin": "http://evil.example", "X-Api-Key": "k"})
        assert r.status_code == 200 and "Access-Control-Allow-Origin" not in r.headers
    with TestClient("--cors-origins", "https://a.example,https://b.example", engine=False) as c:
        r = c.simulate_get("/openapi.json", headers={"Origin": "http://x"})
        assert r.headers["Access-Control-Allow-Origin"] == "https://a.example,https://b.example"


# ------------------------------------------------------------------ names
def test_alias_and_tags(srv):
    """Several --alias names and --tags, as llama-server keeps them (a
    sorted set): the first is the model's name everywhere."""
    m = srv.simulate_get("/v1/models").json
    d = m["data"][0]
    assert (d["id"], d["aliases"], d["tags"]) == ("alpha", ["alpha", "zeta"], ["t1", "t2"])
    assert m["models"][0]["name"] == "alpha"
    assert srv.simulate_get("/props").json["model_alias"] == "alpha"
    r = srv.simulate_post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                        "max_tokens": 1})
    assert r.json["model"] == "alpha"


def test_several_hosts_bind():
    cfg = Config(host="127.0.0.1, ::1,/tmp/rs.sock,unix:/tmp/b,[fe80::1]", port=81)
    assert binds(cfg) == ["127.0.0.1:81", "[::1]:81", "unix:/tmp/rs.sock", "unix:/tmp/b", "[fe80::1]:81"]
    with pytest.raises(ValueError):
        binds(Config(host=" , "))


def test_several_hosts_listen():
    """--host with two addresses: gunicorn listens on both (a real process
    tree on the fake engine)."""
    import requests

    from frontends.testing.server import FakeServer

    s = FakeServer("--host", "127.0.0.1,127.0.0.2").wait_ready()
    try:
        for host in ("127.0.0.1", "127.0.0.2"):
            r = requests.get(f"http://{host}:{s.port}/health", timeout=10)
            assert r.status_code == 200, host
    finally:
        rc, left = s.finish()
    assert rc == 0 and left == []
