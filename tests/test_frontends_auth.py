"""Loading state, API keys, and endpoints switched off by flags."""
from __future__ import annotations

import os
import sys
import time

import pytest
import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fake_engine import Server  # noqa: E402

LOADING = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}


@pytest.fixture(scope="module")
def srv():
    s = Server("--api-key", "k1,k2", "--no-slots", env={"FAKE_LOAD_S": "2.5"})
    yield s
    assert s.stop() == 0


def test_loading_then_ready(srv):
    deadline = time.monotonic() + 20
    while True:  # until a worker answers at all
        try:
            r = requests.get(srv.url("/health"), timeout=2)
            break
        except requests.RequestException:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert r.status_code == 503 and r.json() == LOADING
    r = requests.post(srv.url("/completion"), json={"prompt": "a"})  # no key, still loading: 503 first
    assert r.status_code == 503 and r.json() == LOADING
    srv.wait_ready()
    assert requests.get(srv.url("/health")).json() == {"status": "ok"}


def test_api_keys(srv):
    srv.wait_ready()
    body = {"prompt": "Hello", "n_predict": 1}
    for headers in ({}, {"Authorization": "Bearer nope"}, {"X-Api-Key": "k"}, {"Authorization": "k1x"}):
        r = requests.post(srv.url("/completion"), json=body, headers=headers)
        assert r.status_code == 401
        assert r.json() == {"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}}
    for headers in ({"Authorization": "Bearer k1"}, {"Authorization": "Bearer k2"}, {"X-Api-Key": "k2"}):
        assert requests.post(srv.url("/completion"), json=body, headers=headers).status_code == 200
    assert requests.get(srv.url("/health")).status_code == 200  # open
    assert requests.get(srv.url("/v1/models")).status_code == 401
    assert requests.get(srv.url("/nope")).status_code == 401  # auth before routing, as llama-server


def test_disabled_endpoints(srv):
    srv.wait_ready()
    h = {"Authorization": "Bearer k1"}
    for method, path in (("get", "/slots"), ("post", "/slots/0?action=erase"), ("get", "/metrics")):
        r = getattr(requests, method)(srv.url(path), headers=h)
        assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"


def test_openai_client_with_key(srv):
    openai = pytest.importorskip("openai")
    srv.wait_ready()
    ok = openai.OpenAI(base_url=srv.url("/v1"), api_key="k2")
    assert ok.completions.create(model="m", prompt="Hello", max_tokens=1).choices[0].text == "Hello"
    bad = openai.OpenAI(base_url=srv.url("/v1"), api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
