"""frontends/testing: the shared plumbing's own contracts."""
from __future__ import annotations

import pytest

from frontends import testing


def test_parse_metrics_through_prometheus_client():
    text = ("# HELP llamacpp:tokens_predicted_total x\n# TYPE llamacpp:tokens_predicted_total counter\n"
            "llamacpp:tokens_predicted_total 12.0\n"
            "# TYPE ringserve:engine_phase_seconds counter\n"
            'ringserve:engine_phase_seconds_total{phase="decode"} 1.5\n')
    m = testing.parse_metrics(text)
    assert m["llamacpp:tokens_predicted_total"] == 12.0
    assert m['ringserve:engine_phase_seconds_total{phase="decode"}'] == 1.5


def test_wait_for_returns_the_value_or_names_what_it_waited_for():
    box = iter([0, None, "ok"])
    assert testing.wait_for(lambda: next(box), 5, "the box", step=0.001) == "ok"
    with pytest.raises(TimeoutError, match="the impossible"):
        testing.wait_for(lambda: False, 0.05, "the impossible", step=0.01)
    assert testing.waited(lambda: True, 1) < 0.5


def test_sse_reader():
    lines = [b'data: {"a": 1}\n', b"\n", b": ping\n", b'data: {"b": 2}\n', b"\n", b"data: [DONE]\n", b"\n"]
    assert list(testing.iter_sse(lines)) == [{"a": 1}, {"b": 2}]
    assert testing.sse_events(b"".join(lines).replace(b": ping\n", b"")) == [{"a": 1}, {"b": 2}, "[DONE]"]
    with pytest.raises(ValueError):
        testing.sse_events(b'data: {"a": 1}\n')


def test_client_without_engine_is_loading():
    with testing.TestClient(engine=False) as c:
        assert c.simulate_get("/health").status_code == 503
        assert c.simulate_get("/openapi.json").json["openapi"].startswith("3.")
