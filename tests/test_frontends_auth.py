"""Loading state, API keys, and endpoints switched off by flags, in-process
(testing.TestClient: the worker's app, the fake engine in a thread)."""
from __future__ import annotations

import httpx
import pytest

from frontends.testing import TestClient

LOADING = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
KEY = {"Authorization": "Bearer k1"}


@pytest.fixture(scope="module")
def app():
    with TestClient("--api-key", "k1,k2", "--no-slots", loading=True) as c:
        yield c


def test_loading_then_ready(app):
    r = app.simulate_get("/health")
    assert r.status_code == 503 and r.json == LOADING
    r = app.simulate_post("/completion", json={"prompt": "a"})  # no key, still loading: 503 first
    assert r.status_code == 503 and r.json == LOADING
    assert app.simulate_get("/openapi.json", headers=KEY).status_code == 200  # served while loading
    app.ready()
    assert app.simulate_get("/health").json == {"status": "ok"}


def test_api_keys(app):
    body = {"prompt": "Hello", "n_predict": 1}
    for headers in ({}, {"Authorization": "Bearer nope"}, {"X-Api-Key": "k"}, {"Authorization": "k1x"}):
        r = app.simulate_post("/completion", json=body, headers=headers)
        assert r.status_code == 401
        assert r.json == {"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}}
    for headers in ({"Authorization": "Bearer k1"}, {"Authorization": "Bearer k2"}, {"X-Api-Key": "k2"}):
        assert app.simulate_post("/completion", json=body, headers=headers).status_code == 200
    assert app.simulate_get("/health").status_code == 200  # open
    assert app.simulate_get("/v1/models").status_code == 401
    assert app.simulate_get("/nope").status_code == 401  # auth before routing, as llama-server


def test_disabled_endpoints(app):
    for method, path in (("GET", "/slots"), ("POST", "/slots/0"), ("GET", "/metrics")):
        r = app.simulate_request(method, path, headers=KEY, params={"action": "erase"})
        assert r.status_code == 501 and r.json["error"]["type"] == "not_supported_error"


def test_openai_client_with_key(app):
    openai = pytest.importorskip("openai")
    wsgi = httpx.Client(transport=httpx.WSGITransport(app=app.app))
    ok = openai.OpenAI(base_url="http://testserver/v1", api_key="k2", http_client=wsgi)
    assert ok.completions.create(model="m", prompt="Hello", max_tokens=1).choices[0].text == "Hello"
    bad = openai.OpenAI(base_url="http://testserver/v1", api_key="wrong", max_retries=0, http_client=wsgi)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
