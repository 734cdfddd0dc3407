"""ringserve as a worker of smg (the Shepherd Model Gateway, PyPI ``smg``).

First what a gateway reads, in process (TestClient, fake engine): the
shapes of /v1/loads, /server_info, /model_info, /v1/models and the vllm:*
gauges of /metrics, that they sit behind the API key, that their figures
move as requests run and wait (one instance of the fake engine holding
requests), and that a request with no free channel is a 429 (capacity,
which smg retries elsewhere without a breaker penalty), not a 503.

Then two instances (fake engine, 20 ms a token) behind the real ``smg
launch --policy cache_aware``: smg registers both (model id from
/v1/models), routes /v1/chat/completions (streamed and not) and
/v1/completions, polls /v1/loads on both (its /get_loads shows each
worker's figures, live), keeps a shared long prefix on one worker and
spreads distinct prompts; and SIGKILL of one instance fails only the
requests in flight on it while smg takes it out of routing within its
health-check interval. Why the fake engine: what is tested is the gateway
contract and the instances' lifecycle, not the model.

smg is the wheel's console script (next to this interpreter, or on PATH);
without it the gateway tests are skipped, except under CI (CI set), where
they fail: CI installs .[test], which has smg.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from types import SimpleNamespace

import pytest
import requests

from frontends import testing
from frontends.testing import FakeServer, Stream, free_port, procs, wait_for

TOKEN_S = 0.02
HEALTH_S = 1  # smg's --health-check-interval-secs and --load-monitor-interval here


def find_smg() -> str | None:
    here = os.path.join(os.path.dirname(sys.executable), "smg")
    return here if os.access(here, os.X_OK) else shutil.which("smg")


SMG = find_smg()


@pytest.fixture(scope="module")
def smg_bin() -> str:
    if SMG is None:
        why = "smg not installed (pip install -c constraints.txt '.[test]' brings the smg wheel and its binary)"
        if os.environ.get("CI"):
            pytest.fail(why + " -- CI must install it", pytrace=False)
        pytest.skip(why)
    return SMG


# ---------------------------------------------------------------- shapes
LOAD_KEYS = {"dp_rank", "num_running_reqs", "num_waiting_reqs", "num_waiting_uncached_tokens", "num_total_reqs",
             "num_used_tokens", "max_total_num_tokens", "token_usage", "gen_throughput", "cache_hit_rate",
             "utilization", "max_running_requests"}


def test_gateway_endpoints_shapes():
    with testing.TestClient("--metrics") as c:
        r = c.simulate_get("/v1/loads", query_string="include=core,disagg,queues,memory")
        assert r.status_code == 200, r.text
        body = r.json
        assert set(body) == {"timestamp", "dp_rank_count", "loads"} and body["dp_rank_count"] == 1
        (ld,) = body["loads"]
        assert set(ld) == LOAD_KEYS
        # -c 4096 -np 2: two slots of 2048 cells; nothing runs
        assert (ld["max_total_num_tokens"], ld["max_running_requests"]) == (4096, 2)
        assert (ld["num_running_reqs"], ld["num_waiting_reqs"], ld["num_used_tokens"], ld["token_usage"]) == (0, 0, 0, 0.0)
        for path in ("/server_info", "/get_server_info"):
            info = c.simulate_get(path).json
            assert info["served_model_name"] == c.simulate_get("/v1/models").json["data"][0]["id"]
            assert (info["context_length"], info["max_total_tokens"], info["max_running_requests"]) == (2048, 4096, 2)
            assert info["is_embedding"] is False and info["model_path"].endswith(".gguf")
            assert "version" not in info  # nothing invented
        for path in ("/model_info", "/get_model_info"):
            mi = c.simulate_get(path).json
            assert mi == {"model_path": info["model_path"], "is_generation": True, "model_type": "gemma3",
                          "has_image_understanding": False, "has_audio_understanding": False}
        (m,) = c.simulate_get("/v1/models").json["data"]
        assert (m["owned_by"], m["root"], m["max_model_len"]) == ("llamacpp", info["model_path"], 2048)
        assert c.simulate_get("/version").status_code == 404  # smg would take the worker for vLLM
        got = testing.parse_metrics(c.simulate_get("/metrics").text)
        name = f'model_name="{m["id"]}"'
        for k in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"):
            assert got[f"{k}{{{name}}}"] == 0.0, k
        # 4096 cells in blocks of 16
        assert got[f'vllm:cache_config_info{{block_size="16",{name},num_gpu_blocks="256"}}'] == 1.0
    # the KV events' own block size where --kv-events-config names one (it said 16 whatever the events used)
    ev = '{"enable_kv_cache_events": true, "endpoint": "tcp://127.0.0.1:1", "block_size": 32}'
    with testing.TestClient("--metrics", "--kv-events-config", ev) as c:
        got = testing.parse_metrics(c.simulate_get("/metrics").text)
        assert [k for k in got if k.startswith("vllm:cache_config_info")] == \
            [f'vllm:cache_config_info{{block_size="32",{name},num_gpu_blocks="128"}}'], got


def test_gateway_endpoints_need_the_key():
    with testing.TestClient("--api-key", "k1", "--metrics") as c:
        for path in ("/v1/loads", "/server_info", "/get_server_info", "/model_info", "/get_model_info"):
            assert c.simulate_get(path).status_code == 401, path
            assert c.simulate_get(path, headers={"Authorization": "Bearer k1"}).status_code == 200, path
        assert c.simulate_get("/health").status_code == 200


def test_no_free_channel_is_429():
    """One HTTP thread = one channel: held by a running request, the next one
    is refused for capacity. A request for two choices alone takes them one
    after the other (Runner._more), never a 429."""
    with testing.TestClient("--threads-http", "1", token_s=0.01) as c:
        r = c.simulate_post("/v1/completions", json={"prompt": "a b", "max_tokens": 2, "n": 2})
        assert r.status_code == 200 and len(r.json["choices"]) == 2, r.text
        long = threading.Thread(target=c.simulate_post, args=("/v1/completions",),
                                kwargs={"json": {"prompt": "a b", "max_tokens": 200, "ignore_eos": True}})
        long.start()
        testing.wait_for(lambda: c.fake.tasks == 3, 10, "the long request at the engine")  # then it holds
        # the one channel for ~2 s (a fixed pause was too short for its thread to lease it on a busy machine)
        r = c.simulate_post("/v1/completions", json={"prompt": "a b", "max_tokens": 2})
        long.join()
        assert r.status_code == 429, r.text
        assert r.json["error"]["type"] == "unavailable_error" and "channels" in r.json["error"]["message"]
        r = c.simulate_post("/v1/completions", json={"prompt": "a b", "max_tokens": 2})
        assert r.status_code == 200, r.text  # nothing stayed leased


def loads(base: str) -> dict:
    r = requests.get(base + "/v1/loads", timeout=5)
    assert r.status_code == 200, r.text
    return r.json()["loads"][0]


def vllm(base: str) -> dict[str, float]:
    return {k.split("{")[0]: v for k, v in testing.metrics(base).items() if k.startswith("vllm:num_requests")
            or k.startswith("vllm:kv_cache_usage_perc")}


def test_load_figures_move_with_running_and_waiting():
    """-np 2 and four long streams: two run, two wait in the engine's queue;
    /v1/loads and /metrics say so, from the same snapshot; then all drain."""
    s = FakeServer("--metrics", env={"FAKE_TOKEN_S": "0.05"}).wait_ready()
    try:
        base = s.url("")
        streams = [Stream(s.url("/completion"), {"prompt": f"hold {i} " * 8, "n_predict": 20}).start()
                   for i in range(4)]
        ld = wait_for(lambda: (x := loads(base))["num_running_reqs"] == 2 and x["num_waiting_reqs"] == 2 and x, 10,
                      "2 running and 2 waiting in /v1/loads")
        assert ld["num_total_reqs"] == 4 and ld["num_used_tokens"] > 0
        assert ld["token_usage"] == pytest.approx(ld["num_used_tokens"] / 4096) and ld["utilization"] == ld["token_usage"]
        m = vllm(base)
        assert m["vllm:num_requests_running"] == 2 and m["vllm:num_requests_waiting"] in (1, 2)  # (a third may start)
        assert 0 < m["vllm:kv_cache_usage_perc"] < 1
        for st in streams:
            st.join()
        assert all(st.complete for st in streams), [st.error for st in streams]
        time.sleep(1.1)  # the throughput window (load.WINDOW)
        ld = loads(base)
        assert (ld["num_running_reqs"], ld["num_waiting_reqs"], ld["num_used_tokens"]) == (0, 0, 0)
        assert ld["gen_throughput"] > 0  # 80 tokens in the last window
        assert vllm(base) == {"vllm:num_requests_running": 0, "vllm:num_requests_waiting": 0,
                              "vllm:kv_cache_usage_perc": 0}
    finally:
        s.stop()


# ------------------------------------------------------------ behind smg
class Gateway:
    """``smg launch`` over the given workers on a free loopback port, with
    the probe and poll intervals short; ``stop()`` always ends it."""

    def __init__(self, binary: str, urls: list[str]):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.logf = tempfile.NamedTemporaryFile("w+", suffix=".smg.log", delete=False)
        cmd = [binary, "launch", "--worker-urls", *urls, "--policy", "cache_aware",
               "--host", "127.0.0.1", "--port", str(self.port),
               # probes and load polls every second; one failed probe takes a worker out
               "--health-check-interval-secs", str(HEALTH_S), "--health-failure-threshold", "1",
               "--load-monitor-interval", str(HEALTH_S),
               # its own metrics listener: loopback, a free port (the default 29000 may be taken)
               "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
               "--shutdown-grace-period-secs", "1", "--log-level", "info"]
        self.proc = subprocess.Popen(cmd, stdout=self.logf, stderr=subprocess.STDOUT)
        self.urls = urls

    def log(self) -> str:
        with open(self.logf.name, errors="replace") as f:
            return f.read()[-4000:]

    def workers(self) -> dict[str, dict]:
        return {w["url"]: w for w in requests.get(self.base + "/workers", timeout=5).json()["workers"]}

    def wait_ready(self, timeout: float = 30.0) -> "Gateway":
        def up():
            assert self.proc.poll() is None, f"smg exited: {self.log()}"
            try:
                ws = self.workers()
                # registered, ready, and polled once (a worker's first /v1/loads answer is its engine_load)
                return (requests.get(self.base + "/v1/models", timeout=2).status_code == 200 and len(ws) == len(self.urls)
                        and all(w["status"] == "ready" and "engine_load" in w for w in ws.values()))
            except (requests.RequestException, ValueError, KeyError):
                return False

        wait_for(up, timeout, "smg to register and poll both workers")
        return self

    def stop(self) -> None:
        """SIGKILL: its SIGTERM drain holds the listener for the grace period,
        and at a test's end there is nothing to drain (one process, no children)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.logf.close()
        os.unlink(self.logf.name)


@contextlib.contextmanager
def two_behind_smg(binary: str):
    """Two instances (fake engine, 4 slots each) behind smg; all stopped after."""
    env = {"FAKE_TOKEN_S": str(TOKEN_S)}
    a, b = FakeServer(env=env, np_=4), FakeServer(env=env, np_=4)
    gw = None
    try:
        a.wait_ready()
        b.wait_ready()
        gw = Gateway(binary, [a.url(""), b.url("")]).wait_ready()
        model = requests.get(gw.base + "/v1/models", timeout=5).json()["data"][0]["id"]
        yield SimpleNamespace(a=a, b=b, gw=gw, model=model)
    finally:
        if gw is not None:
            gw.stop()
        for s in (a, b):
            s.stop()


@pytest.fixture(scope="module")
def fleet(smg_bin):
    with two_behind_smg(smg_bin) as f:
        yield f


@pytest.fixture
def doomed_fleet(smg_bin):
    """A fleet of its own: the test kills one of its instances."""
    with two_behind_smg(smg_bin) as f:
        yield f


def submits(s: FakeServer) -> int:
    return sum(1 for e in s.events() if e[0] == "submit")


def test_through_smg(fleet):
    gw, model = fleet.gw, fleet.model
    direct = requests.get(fleet.a.url("/v1/models"), timeout=5).json()["data"][0]
    assert [m["id"] for m in requests.get(gw.base + "/v1/models", timeout=5).json()["data"]] == [direct["id"]]
    w = gw.workers()[fleet.a.url("")]
    # -c 4096 -np 4: a slot (a request) holds 1024 tokens
    assert w["models"][0]["context_length"] == 1024 and w["labels"]["max_running_requests"] == "4", w
    r = requests.post(gw.base + "/v1/chat/completions", timeout=10,
                      json={"model": model, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text
    r = requests.post(gw.base + "/v1/completions", timeout=10, json={"model": model, "prompt": "one two", "max_tokens": 4})
    assert r.status_code == 200 and r.json()["choices"][0]["text"].startswith("one two"), r.text  # the fake echoes
    st = Stream(gw.base + "/v1/chat/completions", {"model": model, "max_tokens": 20,
                                                   "messages": [{"role": "user", "content": "stream it"}]}).run()
    assert st.status == 200 and st.done and st.error is None, (st.status, st.error)
    assert st.times[-1] - st.times[0] > 0.5 * 19 * TOKEN_S  # event by event, not one buffered burst
    st = Stream(gw.base + "/v1/completions", {"model": model, "max_tokens": 5, "prompt": "a b c"}).run()
    assert st.done and "".join(e["choices"][0]["text"] for e in st.events).startswith("a b c")


def concurrently(url: str, bodies: list[dict]) -> list[int]:
    """POST every body at once (a thread each); their statuses."""
    out = [0] * len(bodies)

    def one(i: int) -> None:
        try:
            out[i] = requests.post(url, json=bodies[i], timeout=30).status_code
        except requests.RequestException:
            pass

    ths = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for t in ths:
        t.start()
    for t in ths:
        t.join(35)
    return out


def test_prefix_sticks_distinct_spread(fleet):
    """Eight requests at once with nothing in common are balanced over both
    workers (a cache miss goes to the one with fewer in flight); eight at
    once sharing a long prefix all go to the one that holds it (the spill
    gate is far off). Runs before test_smg_polls_real_load: after requests
    held on an instance behind smg's back, smg sent every request to the
    other one for a while (seen with smg 1.13; its --worker-wedge-secs rule,
    we think)."""
    gw, a, b, model = fleet.gw, fleet.a, fleet.b, fleet.model
    url = gw.base + "/v1/completions"
    a0, b0 = submits(a), submits(b)
    got = concurrently(url, [{"model": model, "prompt": f"{i} {'xyzw'[i % 4]} unrelated {i * 7919} " * 10,
                              "max_tokens": 20} for i in range(8)])
    assert got == [200] * 8, got
    by = (submits(a) - a0, submits(b) - b0)
    assert sum(by) == 8 and min(by) >= 2, by
    shared = "You are a careful assistant who answers in one line. " * 12
    r = requests.post(url, json={"model": model, "prompt": f"{shared}Question?", "max_tokens": 2}, timeout=10)
    assert r.status_code == 200, r.text  # the first one plants the prefix
    a0, b0 = submits(a), submits(b)
    got = concurrently(url, [{"model": model, "prompt": f"{shared}Question {i}?", "max_tokens": 10} for i in range(8)])
    assert got == [200] * 8, got
    by = sorted((submits(a) - a0, submits(b) - b0))
    assert by == [0, 8], by


def test_smg_polls_real_load(fleet):
    """smg's /get_loads shows each worker's own /v1/loads figures (the
    capacity only ringserve reports), and a load held on one instance
    reaches smg within a couple of poll intervals."""
    gw, a = fleet.gw, fleet.a
    got = {x["worker"]: x for x in requests.get(gw.base + "/get_loads", timeout=5).json()["loads"]}
    assert set(got) == {a.url(""), fleet.b.url("")}, got
    assert all((x["max_total_num_tokens"], x["max_running_requests"]) == (4096, 4) for x in got.values()), got
    streams = [Stream(a.url("/completion"), {"prompt": f"direct {i} " * 6, "n_predict": 150}).start() for i in range(3)]
    try:
        def seen():
            x = {x["worker"]: x for x in requests.get(gw.base + "/get_loads", timeout=5).json()["loads"]}[a.url("")]
            return x["num_running_reqs"] == 3 and x["num_used_tokens"] > 0 and x

        x = wait_for(seen, 4 * HEALTH_S, "smg's /get_loads to show the 3 requests running on A")
        assert x["token_usage"] > 0
    finally:
        for st in streams:
            st.join()


def test_sigkill_one_instance(doomed_fleet):
    """Six long streams over both instances and a stream of short requests;
    SIGKILL A: exactly A's streams are cut, B's finish, no short request
    fails (smg retries what A refused on B), and smg marks A out within
    its health-check interval (plus margin)."""
    gw, a, b, model = doomed_fleet.gw, doomed_fleet.a, doomed_fleet.b, doomed_fleet.model
    streams = [Stream(gw.base + "/v1/completions", {"model": model, "prompt": f"long {i} {'pq'[i % 2]} " * (4 + i),
                                                    "max_tokens": 150}).start() for i in range(6)]
    wait_for(lambda: all(st.times or not st.is_alive() for st in streams), 10, "first tokens of the six streams")
    on_a = loads(a.url(""))["num_running_reqs"]
    on_b = loads(b.url(""))["num_running_reqs"]
    assert on_a + on_b == 6 and on_a and on_b, (on_a, on_b)
    calls, stop = [], threading.Event()

    def short():
        n = 0
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                r = requests.post(gw.base + "/v1/completions", timeout=30,
                                  json={"model": model, "prompt": f"short {n} {t0}", "max_tokens": 2})
                ok = r.status_code == 200 and r.json()["choices"][0]["text"].startswith("short")
            except (requests.RequestException, ValueError, KeyError):
                ok = False
            calls.append((t0, time.monotonic(), ok))
            n += 1
            time.sleep(0.02)

    th = threading.Thread(target=short, daemon=True)
    th.start()
    try:
        time.sleep(0.3)
        t_dead = procs.kill_all(a.proc.pid)
        a.proc.wait(5)

        def out():
            w = gw.workers().get(a.url(""))
            return w is None or not w["is_healthy"] or w["status"] != "ready"

        # one probe a second, one failure takes it out: within an interval, plus the margin of a loaded machine
        wait_for(out, HEALTH_S + 2.0, "smg to take the killed worker out")
        t_out = time.monotonic()
        time.sleep(1.5)
    finally:
        stop.set()
        th.join(35)
    for st in streams:
        st.join()
    cut = [st for st in streams if not st.done]
    assert len(cut) == on_a and all(st.status == 200 and st.times for st in cut), [(st.status, st.error) for st in cut]
    assert calls and all(ok for _, _, ok in calls), [(round(t0 - t_dead, 2), ok) for t0, _, ok in calls if not ok]
    after = [c for c in calls if c[0] > t_out]
    assert len(after) >= 10 and max(t1 - t0 for t0, t1, _ in after) < 1.0, after  # straight to B, no retry backoff
