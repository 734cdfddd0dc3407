"""What a balancer and an operator see of one instance: /health?fail_on_no_slot,
the SIGTERM drain, SIGHUP, TTIN/TTOU, the gunicorn config file, the access log.

All run the fake engine (frontends/testing/fake_engine.py) at 20 ms a token, so a stream
of N tokens lasts about N x 20 ms; every wait is a poll with a generous
deadline, never a fixed sleep that a slow machine could outrun.
"""
from __future__ import annotations

import http.client
import re
import signal
import socket
import time
from types import SimpleNamespace

import requests

from frontends.testing import FakeServer as Server
from frontends.testing import Stream, wait_for

from engine.config import Config
from frontends.api.misc import saturated
from ipc.layout import CNT, SLOT_GEN

SLOW = {"FAKE_TOKEN_S": "0.02"}


def status(srv: Server, path: str) -> int:
    return requests.get(srv.url(path), timeout=5).status_code


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return False
    except ConnectionRefusedError:
        return True


def test_saturated_depth(make_arena):
    """Depth 0 is llama-server's fail_on_no_slot (no idle slot); depth N
    waits until N requests queue behind busy slots."""
    arena = make_arena(n_workers=2, n_chan=2, ring_cap=8, sub_cap=8, max_prompt=16, n_slots=2)
    ctx = SimpleNamespace(arena=arena, cfg=Config(queue_fail_depth=0))
    assert not saturated(ctx)
    arena.slots["state"][0] = SLOT_GEN
    assert not saturated(ctx)  # one slot still idle
    arena.slots["state"] = SLOT_GEN
    assert saturated(ctx)
    ctx.cfg.queue_fail_depth = 2
    arena.counters[CNT["requests_deferred"]] = 1
    assert not saturated(ctx)
    arena.counters[CNT["requests_deferred"]] = 2
    assert saturated(ctx)


def test_health_fail_on_no_slot():
    s = Server("--fail-queue-depth", "1", env=SLOW, np_=2).wait_ready()
    streams = []
    try:
        assert status(s, "/health?fail_on_no_slot=1") == 200
        streams = [Stream(s.url("/completion"), {"prompt": "a b c d", "n_predict": 150}).start() for _ in range(2)]
        wait_for(lambda: all(x["is_processing"] for x in requests.get(s.url("/slots")).json()), 10, "both slots busy")
        assert status(s, "/health?fail_on_no_slot=1") == 200  # busy, nobody waiting: under depth 1
        assert status(s, "/slots?fail_on_no_slot=1") == 200
        streams.append(Stream(s.url("/completion"), {"prompt": "a b c d", "n_predict": 5}).start())  # waits for a slot
        wait_for(lambda: status(s, "/health?fail_on_no_slot=1") == 503, 10, "503 with one request queued")
        assert status(s, "/slots?fail_on_no_slot=1") == 503
        assert status(s, "/health") == 200  # serving: liveness stays up
    finally:
        for st in streams:
            st.join()
        assert s.stop() == 0
    assert all(st.complete for st in streams)


def test_sigterm_drains_then_exits_0():
    """In-flight streams finish, /health says 503, new connections are refused."""
    s = Server("--graceful-timeout", "10", env=SLOW).wait_ready()
    st = Stream(s.url("/completion"), {"prompt": "a b c d", "n_predict": 150}).start()  # about 3 s
    wait_for(lambda: st.times, 10, "the first token")
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=5)  # kept alive across the SIGTERM
    conn.request("GET", "/health")
    r = conn.getresponse()
    r.read()
    assert r.status == 200
    t_term = time.monotonic()
    s.proc.send_signal(signal.SIGTERM)

    def health_503():
        conn.request("GET", "/health")
        r = conn.getresponse()
        body = r.read()
        return r.status == 503 and b"shutting down" in body

    try:
        wait_for(health_503, 3, "/health 503 on a kept-alive connection")
        wait_for(lambda: refused(s.port), 3, "the listeners to close")
        assert st.is_alive()  # closed while a stream was still in flight, not after the drain
        st.join()
        code = s.proc.wait(15)
    finally:
        conn.close()
        log = s.log()
        s.stop()
    assert st.complete and len(st.events) == 151, (st.error, st.events[-1:], log)  # 150 tokens + the final event
    assert st.t_end > t_term + 0.3  # it really was in flight during the drain
    assert code == 0 and time.monotonic() - t_term < 10 + 3, log


def test_sighup_keeps_streams_and_engine():
    fmt = "ACCESS %(p)s %(m)s %(U)s %(s)s"  # %(p)s is "<pid>"
    s = Server("--graceful-timeout", "5", "--access-logformat", fmt, env=SLOW, workers=1).wait_ready()
    try:
        eng, old = s.engine_pid, set(s.worker_pids())
        st = Stream(s.url("/completion"), {"prompt": "a b c d", "n_predict": 100}).start()  # about 2 s
        wait_for(lambda: st.times, 10, "the first token")
        s.proc.send_signal(signal.SIGHUP)
        new = wait_for(lambda: set(s.worker_pids()) - old, 10, "a new worker")
        # the old worker closed its listeners when it stopped: from here on only new workers accept
        wait_for(lambda: answered_by(s, "/health") in new, 10, "a new worker to answer")
        r = requests.post(s.url("/completion"), json={"prompt": "Hello world", "n_predict": 2}, timeout=10)
        assert r.json()["content"] == "Hello world"
        st.join()
        assert st.complete and len(st.events) == 101, (st.error, st.events[-1:])
        assert st.t_end > st.t0 + 1.0  # the HUP came while it streamed
        assert s.engine_pid == eng and s.log().count("engine started") == 1
        posts = lambda: {int(m) for m in re.findall(r"ACCESS <(\d+)> POST /completion 200", s.log())}  # noqa: E731
        pids = wait_for(lambda: posts() if len(posts()) == 2 else None, 5, "both POSTs in the access log")
        assert pids & old and pids & new  # the stream finished on the old worker, the new request on a new one
    finally:
        assert s.stop() == 0


def answered_by(srv: Server, path: str) -> int:
    """Request ``path``; the pid the access log names for the latest such request (0: none yet)."""
    requests.get(srv.url(path), timeout=5)
    time.sleep(0.05)  # the access log line is written after the response
    pids = re.findall(rf"ACCESS <(\d+)> GET {re.escape(path)} ", srv.log())
    return int(pids[-1]) if pids else 0


def test_ttin_ttou_and_config_file(tmp_path):
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text('accesslog = "-"\naccess_log_format = "CFG %(m)s %(U)s %(s)s"\ngraceful_timeout = 3\n')
    s = Server("--config", str(conf), workers=1).wait_ready()
    try:
        # the config file's access log settings (the line is written after the response went out)
        wait_for(lambda: "CFG GET /health 200" in s.log(), 5, "the access log line")
        assert len(s.worker_pids()) == 1
        s.proc.send_signal(signal.SIGTTIN)
        wait_for(lambda: len(s.worker_pids()) == 2, 15, "a second worker after TTIN")
        for _ in range(6):
            r = requests.post(s.url("/completion"), json={"prompt": "Hi there", "n_predict": 2}, timeout=10)
            assert r.json()["content"] == "Hi there"
        s.proc.send_signal(signal.SIGTTOU)
        wait_for(lambda: len(s.worker_pids()) == 1, 15, "one worker after TTOU")
        assert requests.get(s.url("/health"), timeout=5).status_code == 200
        assert "no free arena worker index" not in s.log()
    finally:
        assert s.stop() == 0


def test_gunicorn_settings_precedence(tmp_path):
    """The flag, else the config file, else ringserve's default, for what is
    a matter of taste; ringserve's own values for what the arena relies on."""
    from frontends.process.serve import settings

    f = tmp_path / "g.py"
    f.write_text("graceful_timeout = 7\naccesslog = '-'\nworkers = 9\nworker_class = 'sync'\ndaemon = True\n")
    s = settings(Config(workers=2, gunicorn_config=str(f)))
    assert (s.graceful_timeout, s.accesslog, s.workers, s.daemon) == (7, "-", 2, False)
    assert s.worker_class_str == "frontends.process.worker.DrainWorker" and s.max_requests == 0
    assert settings(Config(graceful_timeout=3, gunicorn_config=str(f))).graceful_timeout == 3
    d = settings(Config())
    assert (d.graceful_timeout, d.accesslog) == (2, None)
    assert settings(Config(access_log_format="%(s)s")).accesslog == "-"
