"""/cors-proxy as llama-server serves it (frontends/api/proxy.py): 403 without
--ui-mcp-proxy; with it, only the explicit proxy headers reach the target
(llama.cpp's test_security.py case), statuses and bodies come back as the
target sent them. The target is a loopback server in the test process."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from frontends.testing.client import TestClient


class Target(BaseHTTPRequestHandler):
    def do_GET(self):
        self.server.seen = {k.lower(): v for k, v in self.headers.items()}
        body = b'{"data": [1]}'
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Upstream", "yes")
        self.send_header("Access-Control-Allow-Origin", "http://evil")  # ours replace the target's
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        self.server.posted = self.rfile.read(n)
        self.send_response(204)
        self.end_headers()

    def log_message(self, *a):
        pass


@pytest.fixture
def target():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Target)
    srv.seen, srv.posted = {}, b""
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_disabled_by_default_answers_llama_servers_403():
    with TestClient() as c:
        for r in (c.simulate_get("/cors-proxy"), c.simulate_post("/cors-proxy?url=http://127.0.0.1:1/")):
            assert r.status_code == 403
            assert r.json == {"error": {"message": "this feature is disabled", "type": "feature_disabled"}}


def test_forwards_only_explicit_headers_and_passes_the_answer_back(target):
    url = f"http://127.0.0.1:{target.server_port}/capture"
    with TestClient("--ui-mcp-proxy", "--api-key", "k") as c:
        assert c.simulate_get("/props", headers={"Authorization": "Bearer k"}).json["cors_proxy_enabled"] is True
        assert c.simulate_get(f"/cors-proxy?url={url}").status_code == 401  # the key gate applies
        r = c.simulate_get(f"/cors-proxy?url={url}", headers={
            "Authorization": "Bearer k", "Cookie": "s=1", "X-Api-Key": "k", "Origin": "http://localhost",
            "x-llama-server-proxy-header-accept": "application/json",
            "x-llama-server-proxy-header-authorization": "Bearer explicit"})
        assert r.status_code == 201 and r.json == {"data": [1]}
        assert r.headers["X-Upstream"] == "yes" and r.headers["Content-Type"] == "application/json"
        assert r.headers["Access-Control-Allow-Origin"] == "http://localhost"
        seen = target.seen
        assert seen["accept"] == "application/json" and seen["authorization"] == "Bearer explicit"
        assert "cookie" not in seen and "x-api-key" not in seen
        r = c.simulate_post(f"/cors-proxy?url=http://127.0.0.1:{target.server_port}", body=b'{"a": 1}',
                            headers={"Authorization": "Bearer k", "Content-Type": "application/json"})
        assert r.status_code == 204 and r.content == b"" and target.posted == b'{"a": 1}'
        for bad, why in (("ftp://127.0.0.1/x", "unsupported URL scheme"), ("http://u:p@127.0.0.1/", "authentication"),
                         ("nohost", "missing host")):
            r = c.simulate_get(f"/cors-proxy?url={bad}", headers={"Authorization": "Bearer k"})
            assert r.status_code == 500 and why in r.json["error"]["message"], r.text
